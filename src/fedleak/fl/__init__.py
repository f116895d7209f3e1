"""Federated-learning simulation: client gradients, FedAvg server, rounds and evaluation."""
