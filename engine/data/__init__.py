"""Training data: conversations in, chat templates and loss masks, the target's features
captured with transformers into shards (prepare), and the readers of every data layout."""
