"""What operators see of the running service: Prometheus instruments and log formats. The lowest
layer beside `config`: every other layer may count and log through it, and it imports none."""
