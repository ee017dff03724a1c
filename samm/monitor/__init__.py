"""Monitor stage: collectors send per-instance CPU/RAM and queue counters to Graphite
(`collector`, `graphite_client`); `GraphiteSource` reads the last complete interval back and
`assemble` joins it with the executor's inventory into the analyzer's `RawSnapshot`.
`local_graphite` runs a private carbon-cache + graphite-web for tests and demos.
See docs/monitor.md and docs/metric-naming.md."""
