"""The ground layer: what every other layer may use and nothing here imports from above.

- ``errors``: the package's exception classes (every refusal a user sees is one of them);
- ``memory``: how much host memory the process can still take (read before a large forward pass);
- ``progress``: progress bars on long work (tqdm, silent when asked);
- ``provenance``: what made a result (package versions, hashes, the machine).
"""
