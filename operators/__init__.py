"""The Kubernetes operator: TrainingJob CRD, kopf handlers, and the Cluster interface over pods."""
