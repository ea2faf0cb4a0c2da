"""The evaluation methods, by name, in the order tables and plots show them (evaluate validates
`methods:` against it; report orders by it; report cannot import evaluate, so both import this)."""

METHODS = (
    "plain",
    "eagle3",
    "specexit",
    "specexit_paper",
    "specexit_default",
    "effort",  # SpecExit at each reasoning effort level (EvalConfig.efforts): one row per level
    "budget",
    "deer",
    "dynasor",
    "nothink",
    "oracle",
)
