"""arlo's Python package: the trainer bridge (arlo.bridge: batches in, weights out, over
libarlo_bridge.so), the off-policy loss library (arlo.loss) and what the example trainers share
(arlo.trainer_support). Installed editable into the project environment by
`scripts/bootstrap --python`; `arlo.bridge` needs only numpy (torch when present)."""
