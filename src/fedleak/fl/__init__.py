"""Federated-learning simulation: client updates, FedAvg server, rounds and evaluation."""

from fedleak.fl.client import client_context, client_update, local_update
from fedleak.fl.server import FLSettings, run_federated

__all__ = ["FLSettings", "client_context", "client_update", "local_update", "run_federated"]
