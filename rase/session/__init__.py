"""Sessions: a registered model verified and loaded once (plan, tokenizer, templates, its worker),
kept while used (keep-alive), and what a request asks made into what its worker runs."""
