"""The results file: its schema (records), its text (serialise), how it is written while a run goes on (writer,
safe_write: atomic, never onto an input), continuing a run from it (resume), and the flat summary fields."""
