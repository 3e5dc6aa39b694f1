"""Where the `mineru` engine's generate() runs: `base.py` is the interface every runtime
implements; `transformers` (loading in `transformers_model`, batching in
`transformers_generate`), `http` and `llama_cpp` implement it. Importing this package is
light: the daemon probes an http server with `http.py`."""
