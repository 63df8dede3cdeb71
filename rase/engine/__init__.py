"""The serving engine of one loaded model: the worker thread that runs its steps, the scheduler
that decides them, the KV manager that owns every request's memory, the request and its channel,
sampling, drafting, and the prompt-only readers (embeddings, perplexity)."""
