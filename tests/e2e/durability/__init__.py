"""Durability end to end: restarts, paging, disk and memory alarms, transactions."""
