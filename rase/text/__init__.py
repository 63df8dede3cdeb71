"""Text beside the engine: the tokenizer, chat templates, a request's text state token by token
(UTF-8, stop strings, <think> blocks, harmony channels, tool calls) and structured output."""
