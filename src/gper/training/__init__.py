"""The parts of the DQN trainer (:mod:`gper.dqn`) that are not DQN: running a step as CUDA
graphs with per-phase timing, device-side episode bookkeeping, asynchronous readback, the run
folder (metrics, plot, checkpoint) and the command line."""
