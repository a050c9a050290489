"""Attach mode: read a running vLLM, SGLang or llama.cpp server's Prometheus `/metrics` and its
OpenAI-compatible chat stream. Torch-free and Qt-free: the GUI process and the CLI import it."""
