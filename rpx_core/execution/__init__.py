"""Running a plan, in the order a job travels: the pipeline hands every job to the executor plugin (executors), which
runs each here through a runner (runners: worker processes forked by the zygote, or in-process) or elsewhere; the
stage loop runs a task's stages and reports events (tasks) back to the pipeline, which records them."""
