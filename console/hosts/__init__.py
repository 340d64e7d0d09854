"""One host and what runs on it: its transport and paths, pushing code, running the engine
there (doctor and its report)."""
