"""Target features through a running vLLM: the capture server's command line, the client
that reads one sample, `prepare --from-vllm` and the stream `train --online --from-vllm` reads."""
