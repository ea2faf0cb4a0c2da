"""Where the shipped toy models live (inside the package, so an installed wheel has them too)."""

from pathlib import Path

ASSETS = Path(__file__).resolve().parent / "assets"
TEACHER_DIR = ASSETS / "teacher"
DRAFT_DIR = ASSETS / "draft"
