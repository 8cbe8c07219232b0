"""The batch_search stage: the best batch sizes for a pipeline of models under a memory budget, and its planner."""
