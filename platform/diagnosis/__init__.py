"""Diagnosis: localize the faulty machine from stacks, metrics and logs."""
