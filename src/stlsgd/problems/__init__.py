"""Problems: an objective, its per-client local step and its evaluation."""
