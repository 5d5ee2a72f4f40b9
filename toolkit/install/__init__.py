"""The environment: pinned versions, `toolkit setup`, Horovod's build with its workaround table, the toolchain, wheelhouses, `toolkit doctor`."""
