"""vLLM's rejection samplers (V1 and Model Runner V2) behind the protocol, bound by each release's contract."""
