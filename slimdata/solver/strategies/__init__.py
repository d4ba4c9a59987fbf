"""One module per packing strategy; each exposes one pure function returning a StepPlan."""
