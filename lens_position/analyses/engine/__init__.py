"""The decomposition's engine: the (query, key) pairs and their one-hot features (``design``), each
batch of scores reduced to float64 statistics with the key-set check (``statistics``), the fit from
statistics to every component for many weightings of the sequences at once (``fit``), and the
float64 ``exp``/``log`` kernels (``kernels``). :mod:`lens_position.analyses.decompose` and
:mod:`lens_position.analyses.rotary_bands` are built on it, through these public names."""
