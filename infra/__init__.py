"""Starts, checks and stops the services epistream runs on, as plain processes."""
