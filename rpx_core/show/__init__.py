"""Presentation: a results file as tables, charts, a comparison and an HTML report, and what the console shows while
a run goes on. Figures reach people through one place for units (units); nothing here runs a model."""
