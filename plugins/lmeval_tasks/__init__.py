"""threadweaver.lmeval_tasks: lm-eval tasks and the `threadweaver` model."""
