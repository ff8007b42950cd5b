"""AMD Instinct and ROCm: what distval knows about them, torch-free. The platform's names and
numbers (platform.py: gfx architectures, products, ROCm versions, the three visible-devices
variables), amd-smi and rocm-smi read into one host model (smi.py), and the RCCL/HSA environment
variables that matter (env.py). `doctor` turns them into checks (doctor/amd.py); `device.py`,
the planner's presets and the trace analysis use platform.py. docs/rocm.md says what runs how."""
