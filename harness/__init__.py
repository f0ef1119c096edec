"""The real parts the tests and the benchmarks both drive: a vLLM server on the CPU with a tiny model, load,
the sidecar as a process, GIL targets, the labelled scenarios; under gpu/, the staged vLLM, workloads and
their written truth on the H200 machine. Nothing here asserts: tests/ asserts, bench/ measures."""
