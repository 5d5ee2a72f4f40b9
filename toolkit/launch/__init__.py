"""How the ranks are started: argv and environment for horovodrun, mpirun and TF_CONFIG workers (no framework import), what a launch prints, Slurm and MPIJob recipes."""
