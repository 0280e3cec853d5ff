"""Stalwart inside the frameworks people train with: a few lines in the user's script.

Each integration reports progress (step, loss, tokens, where the step's time went), checkpoints and
the data position to the node agent exactly as the project's own examples do, through the worker
SDK, and stays a no-op outside Stalwart. They run in the user's training image, so they import only
the worker side (the worker SDK, the checkpoint engine, the data loader) and the framework itself,
and each framework only when its module is imported.
"""
