"""Fleet services: provisioning, the instance manager API, verifiers."""
