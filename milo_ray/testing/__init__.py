"""Reusable test suites for contracts that several implementations must honour."""
