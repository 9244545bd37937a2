"""The ``fleetenv`` command line."""
