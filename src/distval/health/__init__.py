"""Job health: naming the rank that broke a job (diagnose.py); the hang watchdog, stragglers,
consistency and fault injection land here."""
