"""The GPU KV-cache Serve profiles (serve_app/profiles/kv_*.yaml): each is serve_app/gpu_tp2.yaml plus
one KV offloading setup, and each setup is one vLLM 0.32 accepts. Validated here, not run (no GPU)."""

import copy
import inspect

import pytest
import yaml

from serve_app.config import load_args
from specexit_core.kv_cache.settings import kv_transfer_config
from support.paths import REPO_ROOT

PROFILES = sorted((REPO_ROOT / "serve_app" / "profiles").glob("kv_*.yaml"))


def _app(path):
    (app,) = yaml.safe_load(path.read_text())["applications"]
    return app


def _without_kv(cfg: dict) -> dict:
    cfg = copy.deepcopy(cfg)
    model = cfg["applications"][0]["args"]["model"]
    model["engine_kwargs"].pop("kv_transfer_config", None)
    model["env"] = {k: v for k, v in model["env"].items() if not k.startswith("LMCACHE_")}
    return cfg


def test_every_profile_is_present():
    assert [p.stem for p in PROFILES] == ["kv_lmcache", "kv_native_tiered", "kv_specexit_tiered", "kv_ucm"]


@pytest.mark.parametrize("path", PROFILES, ids=lambda p: p.stem)
def test_profile_is_gpu_tp2_plus_a_kv_transfer_config_vllm_accepts(path):
    from vllm.config import KVTransferConfig
    from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory

    from serve_app.app import llm_config

    base = yaml.safe_load((REPO_ROOT / "serve_app" / "gpu_tp2.yaml").read_text())
    assert _without_kv(yaml.safe_load(path.read_text())) == base  # only the KV setup differs
    args = load_args(_app(path)["args"])  # the Serve app's own validation (engine_kwargs included)
    ktc = llm_config(args).engine_kwargs["kv_transfer_config"]
    cfg = KVTransferConfig(**ktc)  # vLLM's validation
    assert cfg.is_kv_producer and cfg.is_kv_consumer
    assert cfg.kv_connector in KVConnectorFactory._registry or cfg.kv_connector_module_path


def test_native_tiered_profile_names_a_registered_spec_and_filesystem_tier():
    from vllm.v1.kv_offload.factory import OffloadingSpecFactory
    from vllm.v1.kv_offload.tiering.factory import SecondaryTierFactory

    extra = _app(REPO_ROOT / "serve_app/profiles/kv_native_tiered.yaml")["args"]["model"]["engine_kwargs"]
    extra = extra["kv_transfer_config"]["kv_connector_extra_config"]
    assert extra["spec_name"] in OffloadingSpecFactory._registry
    (tier,) = extra["secondary_tiers"]
    tier_cls = SecondaryTierFactory._registry[tier["type"]]()
    params = inspect.signature(tier_cls.__init__).parameters
    assert set(tier) - {"type"} <= set(params)  # root_dir is a constructor argument of the fs tier
    assert extra["cpu_bytes_to_use"] > 0


def test_specexit_profile_is_the_connectors_own_config():
    ktc = _app(REPO_ROOT / "serve_app/profiles/kv_specexit_tiered.yaml")["args"]["model"]["engine_kwargs"]
    assert ktc["kv_transfer_config"] == kv_transfer_config("/mnt/kv-cache/specexit", host_bytes=32 << 30)
