"""How the ranks are started (no framework import): the LaunchSpec and its common rules (spec.py), one module
per launcher behind one interface and their table (launchers/: horovodrun, mpirun, TF_CONFIG workers, torchrun,
Ray, Spark), running a spec (launcher.py), what a launch prints (output.py), Slurm and MPIJob recipes."""
