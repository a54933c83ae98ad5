"""Stand-in for `sglang.srt.models`: a few of the model modules SGLang registers, each naming its classes in
`EntryClass` as the real modules do (srt/models/registry.py collects them). An architecture not here is
unknown to the simulated engine, which has no transformers to fall back on."""
