"""Thin Prefect task wrappers around agent_core, one verb each."""
