"""threadweaver.vllm_orchestrator: engines that run the shared orchestration state machine on vLLM and SGLang."""
