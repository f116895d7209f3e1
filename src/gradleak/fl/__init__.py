"""Federated-learning simulation: client updates, FedAvg server, rounds and evaluation."""

from gradleak.fl.client import (
    batch_schedule,
    client_context,
    client_update,
    epoch_schedule,
    local_update,
    rows_of,
)
from gradleak.fl.server import FLSettings, run_federated

__all__ = ["FLSettings", "batch_schedule", "client_context", "client_update", "epoch_schedule",
           "local_update", "rows_of", "run_federated"]
