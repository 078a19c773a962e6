"""``threadweaver curate``: parallel SFT data from sequential reasoning traces, with any
OpenAI-compatible LLM (stage 1 of the paper's data). See :mod:`threadweaver.curate.pipeline`."""
