"""Break each claim on purpose and check that its test fails (mutation testing, by hand-picked mutants).

    .venv/bin/python tests/break_claims.py              # every mutant (about 10 minutes on 2 cores)
    .venv/bin/python tests/break_claims.py resume ssp   # those whose id starts with one of the words
    .venv/bin/python tests/break_claims.py --list

Each mutant is a small edit to the toolkit's code that makes one README claim false (resume
silently retraining from step 0, the SSP server loosening its bound, ...). The script applies it,
runs the tests that guard the claim, restores the file (always, also on Ctrl-C) and prints whether
the tests failed, as they must. docs/TESTING.md lists the claims, their tests and these mutants.
Not part of `make test` (each mutant reruns real multi-rank jobs); nothing here is committed broken.
"""
from __future__ import annotations

import argparse
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class Mutant:
    id: str
    claim: str
    edits: tuple[tuple[str, str, str], ...]     # (file, text, replacement): each text occurs once
    tests: tuple[str, ...]


D, C, P = "tests/test_distributed.py", "tests/test_distributed_communication.py", "tests/test_ps.py"
A, N = "tests/test_api.py", "tests/test_numerics.py"
W = "tests/test_workloads.py"
TU = "tests/test_tf_usercode.py"
MU = "tests/test_mxnet_usercode.py"
I = "tests/test_install.py"
NT = "tests/test_native_torch.py"
TC, TS = "tests/test_compression.py", "tests/test_scaling.py"
MUTANTS = [
    Mutant("reduced-owner-keeps-float", "the compressed allreduce gives every rank the same result (the owner decodes its own chunk too)",
           (("toolkit/exchange/exchanges.py", "            if e > a:\n                cc.set_into(out[a:e]",
             "            if e > a and a != start:\n                cc.set_into(out[a:e]"),),
           (f"{TC}::test_compressed_allreduce_gives_every_rank_the_same_mean",)),
    Mutant("reduced-second-error-dropped", "error feedback covers the compressed allreduce's second quantisation",
           (("toolkit/exchange/exchanges.py", "            x += self.owner_residual[start:end]", "            pass"),),
           (f"{TC}::test_compressed_allreduce_error_feedback_covers_both_quantisations",)),
    Mutant("reduced-not-saved", "a resume restores the compressed allreduce's second residuals",
           (("toolkit/exchange/exchanges.py", '            out["owner_residuals"] = self.owner_residual', "            pass"),),
           (f"{C}::test_compressed_allreduce_on_three_ranks[torch]",)),
    Mutant("reduced-never", "bf16 and int8 run the compressed allreduce from 3 ranks on",
           (("toolkit/planner/scaling.py", "    if n >= 3:\n        return \"reduce\"", "    if n >= 30:\n        return \"reduce\""),),
           (f"{TC}::test_the_allgather_stays_at_two_ranks_and_the_compressed_allreduce_runs_above",
            f"{C}::test_compressed_allreduce_on_three_ranks[mxnet]")),
    Mutant("wire-allgather-once", "wire_bytes_per_step counts an allgather's N-1 payloads",
           (("toolkit/exchange/wire.py", '"allgather": (n - 1) * nbytes', '"allgather": nbytes'),),
           (f"{TS}::test_step_time_stragglers_and_methods", f"{C}::test_compressed_allreduce_on_three_ranks[mxnet]")),
    Mutant("stream-resize-drops-window", "a sharded stream resized mid-epoch skips no sample",
           (("toolkit/run/streams.py", "            left = _as_intervals(sorted(positions[order[consumed - start:]]))",
             "            left = []"),),
           ("tests/test_streams.py::test_resume_and_resize_mid_epoch_neither_repeat_nor_skip",
            "tests/test_shards.py::test_every_sample_once_per_epoch_across_a_resume_on_more_ranks[mxnet-3]")),
    Mutant("stream-resume-rereads", "a sharded stream resumed mid-epoch repeats no sample",
           (("toolkit/run/streams.py", "        return RankReads(pieces, windows, consumed - first * self.window)",
             "        return RankReads(pieces, windows, 0)"),),
           ("tests/test_streams.py::test_resume_in_the_same_world_is_the_uninterrupted_stream",
            "tests/test_shards.py::test_every_sample_once_per_epoch_across_a_resume_on_more_ranks[torch-3]")),
    Mutant("stream-ranks-overlap", "sharded streams: every sample once per epoch across the ranks",
           (("toolkit/run/streams.py", "        span, consumed = spans[self.rank], self.segments[-1][1]",
             "        span, consumed = spans[0], self.segments[-1][1]"),),
           ("tests/test_streams.py::test_every_sample_once_per_epoch_and_the_tail_dropped",
            "tests/test_shards.py::test_every_sample_once_per_epoch_across_a_resume_on_more_ranks[tensorflow-1]")),
    Mutant("foreign-stream-rank-alone", "a user's unsharded streams of different lengths: all ranks stop together",
           (("adapters/loader.py", "            full = self.session.mean(1.0 if len(step) == s.k else 0.0, name=\"toolkit.stream_more\") == 1.0",
             "            full = len(step) == s.k"),),
           ("tests/test_shards.py::test_a_stream_the_toolkit_did_not_shard_trains_and_says_so_once[torch]",)),
    Mutant("crossing-inverted", "toolkit plan's crossing is the link below which a method beats none",
           (("toolkit/planner/scaling.py", "        lo, hi = (mid, hi) if faster(math.exp(mid)) else (lo, mid)",
             "        lo, hi = (lo, mid) if faster(math.exp(mid)) else (mid, hi)"),),
           (f"{TS}::test_crossing_is_the_link_where_a_method_stops_paying",)),
    Mutant("resume-from-zero", "--resume continues from the newest checkpoint (it does not retrain from step 0)",
           (("toolkit/run/pipeline.py", "        return session.load(collective=not config.elastic)", "        return {}"),),
           (f"{D}::test_resume_reaches_the_uninterrupted_parameters[torch]",)),
    Mutant("resume-ps-from-zero", "parameter-server checkpoints resume (servers reload their shards)",
           (("toolkit/run/ps.py", '        self.version = int(meta["step"])', "        self.version = 0"),),
           (f"{P}::test_one_worker_at_staleness_0_is_synchronous_sgd_and_the_servers_checkpoints_resume",)),
    Mutant("no-broadcast", "ranks that start from different weights end identical (the broadcast)",
           (("adapters/base.py", "            self.broadcast()\n        # From here on", "            pass\n        # From here on"),),
           (f"{D}::test_two_ranks_start_different_and_end_identical[torch-gloo]",)),
    Mutant("no-broadcast-no-check", "replicas identical, even with the trainer's own check gone",
           (("adapters/base.py", "            self.broadcast()\n        # From here on", "            pass\n        # From here on"),
            ("adapters/base.py", "        if len(set(digests)) != 1:\n            raise ToolkitError(\"replica check",
             "        if False:\n            raise ToolkitError(\"replica check")),
           (f"{D}::test_two_ranks_start_different_and_end_identical[torch-gloo]",)),
    Mutant("replica-check-off", "the trainer stops a job whose replicas differ",
           (("adapters/base.py", "        if len(set(digests)) != 1:\n            raise ToolkitError(\"replica check",
             "        if False:\n            raise ToolkitError(\"replica check"),),
           ("tests/test_replica_check.py",)),
    Mutant("ssp-loose", "SSP: no worker more than `staleness` steps ahead (server loosened, its record clamped)",
           (("toolkit/run/ps.py", "if self.bound is None or gap <= self.bound:", "if self.bound is None or gap <= self.bound + 3:"),
            ("toolkit/run/ps.py", "self.clock_gaps[max(gap, 0)] += 1", "self.clock_gaps[min(max(gap, 0), self.bound)] += 1")),
           (f"{P}::test_ssp_with_a_straggler_keeps_its_bound_and_trains_digits[torch]",)),
    Mutant("uneven-ignored", "uneven_data trains a rank on part of its batches",
           (("toolkit/run/trainer.py", "my_steps = int(spe * fractions.get(rank, 1.0))", "my_steps = spe"),),
           ("tests/test_uneven.py",)),
    Mutant("adasum-averages", "op: adasum is Horovod's Adasum",
           (("adapters/horovod.py", 'Op.ADASUM: getattr(hvd, "Adasum", None)', "Op.ADASUM: hvd.Average"),),
           (f"{C}::test_adasum_trains_on_two_mpi_ranks[torch]",)),
    Mutant("local-sgd-is-sync", "local SGD trains locally between averages",
           (("toolkit/exchange/communication.py", "if self.local_steps and step >= self.warmup_steps:", "if False:"),),
           (f"{C}::test_local_sgd_with_one_local_step_equals_synchronous[torch]",)),
    Mutant("no-warmup", "lr warm-up ramps over warmup_epochs",
           (("toolkit/run/schedule.py", "if warmup_steps <= 0 or step >= warmup_steps:", "if True:"),),
           (f"{D}::test_lr_scaling_and_warmup_by_world_size[torch]",)),
    Mutant("bytes-constant", "bytes_sent_per_step is what Horovod reduced (fp16: 2 bytes a value)",
           (("toolkit/exchange/communication.py", "    return 2 if config.compression is Compression.FP16 else 4",
             "    return 4"),),
           (f"{D}::test_fp16_compression_close_to_none[torch]",)),
    Mutant("bytes-at-one-rank", "a 1-rank job sends no bytes",
           (("toolkit/exchange/communication.py", "        if self.world > 1:      # nothing crosses the wire",
             "        if True:      # nothing crosses the wire"),),
           (f"{D}::test_single_process_runs_unchanged_and_writes_its_config[torch]",)),
    Mutant("fp16-ignored", "compression: fp16 really compresses (Horovod's fp16 compressor)",
           (("adapters/horovod.py", "compression = hvd.Compression.fp16 if config.compression is Compression.FP16 "
             "else hvd.Compression.none", "compression = hvd.Compression.none"),),
           (f"{D}::test_fp16_compression_close_to_none[torch]",)),
    Mutant("accumulation-off", "accumulation_steps k x batch b equals one batch of k*b",
           (("adapters/torch/strategies/horovod.py", "backward_passes_per_step=self.config.accumulation_steps",
             "backward_passes_per_step=1"),),
           (f"{D}::test_accumulation_equals_large_batch[torch]",)),
    Mutant("op-sum-averages", "op: sum is the sum of the ranks' gradients",
           (("adapters/horovod.py", "Op.SUM: hvd.Sum", "Op.SUM: hvd.Average"),),
           (f"{D}::test_op_sum_is_average_times_world_size[torch]",)),
    Mutant("checkpoint-gap", "a writer killed at any moment leaves the newest checkpoint whole",
           (("toolkit/run/checkpoint.py", 'for p in root.glob(f".{PREFIX}*.{REPLACED}-*"):', "for p in []:"),),
           ("tests/test_checkpoint.py::test_a_writer_killed_while_replacing_a_step_leaves_the_old_checkpoint",)),
    Mutant("corrupt-undetected", "a corrupt checkpoint is refused with one line naming it",
           (("toolkit/run/checkpoint.py", "if not p.is_file() or sha256(p) != digest:", "if not p.is_file():"),),
           ("tests/test_checkpoint.py::test_corrupt_latest_is_a_clear_error_and_older_untouched",
            f"{D}::test_corrupt_checkpoint_on_resume[torch]")),
    Mutant("residuals-lost", "top-k resume restores every rank's error-feedback residual",
           (("toolkit/exchange/communication.py", "        self.exchange.load_state({name:", "        (lambda _: None)({name:"),),
           (f"{C}::test_topk_sends_a_hundredth_and_resumes_exactly[torch]",
            f"{C}::test_powersgd_and_dgc_resume_exactly[powersgd-torch]")),
    Mutant("powersgd-no-feedback", "PowerSGD's error feedback adds back what the low-rank factors missed",
           (("toolkit/exchange/exchanges.py", "            flat += self.residual\n        ps = [", "            pass\n        ps = ["),),
           ("tests/test_compression.py::test_error_feedback_holds_back_what_was_not_sent",)),
    Mutant("powersgd-local-p", "PowerSGD replicas stay identical (P is allreduced before it is orthonormalised)",
           (("toolkit/exchange/exchanges.py", "            first = comm.allreduce(first, average=True)", "            pass"),),
           (f"{C}::test_powersgd_trains_and_keeps_replicas_identical[torch]",
            "tests/test_compression.py::test_every_rank_gets_the_same_mean_bit_for_bit")),
    Mutant("dgc-no-momentum", "DGC's momentum correction: the momentum moves into the exchange",
           (("toolkit/exchange/exchanges.py", "        u *= self.momentum\n", "        u *= 0\n"),),
           (f"{C}::test_dgc_at_one_percent_stays_near_uncompressed_on_digits[torch]",)),
    Mutant("bytes-at-one-rank-exchange", "the toolkit's exchange sends no bytes at world size 1",
           (("toolkit/exchange/exchanges.py", "            self.calls = []\n            self.timer.start()",
             "            self.calls = [(\"allgather\", 8)]\n            self.timer.start()"),),
           (f"{C}::test_one_rank_sends_nothing_but_still_compresses",)),
    Mutant("topk-sample-trusted", "top-k keeps exactly the k largest, also when the sampled threshold misleads",
           (("toolkit/exchange/compression.py", "        if len(candidates) < k:\n            return ops.topk_positions(mags, k)\n",
             "        if len(candidates) < k:\n            return candidates\n"),),
           ("tests/test_compression.py::test_topk_on_a_large_buffer_is_still_exactly_the_k_largest",)),
    Mutant("two-line-error", "bad input is exactly one line on stderr",
           (("toolkit/messages.py", '    write(line(getattr(error, "label", "error"), error))',
             '    write(line(getattr(error, "label", "error"), error) + "\\nsee the README")'),),
           ("tests/test_cli_errors.py::test_bad_flags",)),
    Mutant("tf-noise", "TensorFlow's C++ start-up logs stay off stderr",
           (("toolkit/run/quiet.py", "    return bool(NOISE.match(line) or (after_noise and CONTINUATION.match(line)))",
             "    return False"),),
           (f"{D}::test_adasum_over_gloo_is_a_clear_error[tensorflow]",)),
    Mutant("launcher-code", "toolkit launch exits with the failed rank's code, no traceback",
           (("toolkit/launch/output.py", "            return self.rank_code or returncode", "            return returncode"),),
           ("tests/test_cli_errors.py::test_a_rank_failing_under_toolkit_launch_shows_its_line_and_exits_with_its_code",)),
    Mutant("buffers-not-synced", "a user's BatchNorm model ends identical on every rank",
           (("adapters/base.py", "        if self.size == 1:\n            return\n        for i, part",
             "        if True:\n            return\n        for i, part"),),
           (f"{A}::test_a_user_model_with_batchnorm_starts_apart_ends_identical_and_sees_every_sample_once[torch]",)),
    Mutant("order-per-rank", "every sample is seen once per epoch across the ranks",
           (("toolkit/run/data.py", "        return epoch_order(self.n, self.epoch, self.seed) if self.train and self.shuffle",
             "        return epoch_order(self.n, self.epoch, self.seed + self.replicas.start) if self.train and "
             "self.shuffle"),),
           (f"{A}::test_a_user_model_with_batchnorm_starts_apart_ends_identical_and_sees_every_sample_once[torch]",)),
    Mutant("position-lost", "a resume mid-epoch carries on where the checkpoint was (no sample twice)",
           (("adapters/base.py", "        for loader, state in zip(self.loaders, meta.get(\"loaders\", [])):",
             "        for loader, state in zip(self.loaders, []):"),),
           (f"{A}::test_resume_mid_epoch_equals_the_uninterrupted_run_and_sees_every_sample_once[torch]",)),
    Mutant("user-loss-ignored", "the `loss` beside a user's build() replaces cross-entropy",
           (("toolkit/api.py", '        return model, usercode.companion(config.model, "loss")',
             "        return model, None"),),
           (f"{A}::test_the_built_in_script_uses_the_users_loss",)),
    Mutant("bar-everywhere", "rank 0's progress bar only on a terminal",
           (("toolkit/run/trainer.py", "if rank != 0 or config.quiet or not sys.stderr.isatty():",
             "if rank != 0 or config.quiet:"),),
           ("tests/test_observability.py::test_progress_bar_on_a_terminal_only",)),
    Mutant("clip-before-reduce", "clip_grad_norm clips the reduced gradient (with accumulation: the large batch's)",
           (("adapters/base.py", "        self.strategy.reduce(self)\n        self.precision.unscale(self.optimizer)\n",
             "        self.precision.unscale(self.optimizer)\n"),
            ("adapters/base.py", "        with self.strategy.reduced(self):\n",
             "        self.strategy.reduce(self)\n        with self.strategy.reduced(self):\n")),
           (f"{N}::test_clipping_bounds_the_reduced_gradient_and_with_accumulation_equals_the_large_batch[torch]",)),
    Mutant("nan-guard-off", "a non-finite step stops every rank with one line and saves nothing",
           (("adapters/base.py", "        if not self.config.nan_guard:\n            return\n        if self.grad_norm",
             "        if True:\n            return\n        if self.grad_norm"),),
           (f"{N}::test_a_diverging_run_stops_every_rank_at_the_same_step_and_saves_nothing[torch]",)),
    Mutant("sync-bn-local", "sync_batchnorm normalises with the statistics of every rank's batch",
           (("adapters/torch/batchnorm.py", "        if not training or self.world() == 1:",
             "        if True:"),),
           ("tests/test_precision.py::test_sync_batchnorm_gives_every_rank_the_statistics_of_the_union[torch]",)),
    Mutant("bf16-ignored", "precision bf16 runs the forward pass in bf16",
           (("adapters/torch/precision.py", '{"bf16": torch.bfloat16, "fp16": torch.float16}', '{"fp16": torch.float16}'),),
           ("tests/test_precision.py::test_bf16_trains_close_to_fp32_and_really_runs_in_bf16[torch]",)),
    Mutant("mxnet-bf16-unchecked", "MXNet's bf16 on a CPU without AVX-512 is one line, not a crash in MXNet's engine",
           (("adapters/mxnet/precision.py", "    if not toolchain.cpu_runs_bf16(flags):", "    if False:"),),
           ("tests/test_precision.py::test_mxnet_bf16_needs_avx512_and_says_so_in_one_line",
            "tests/test_precision.py::test_bf16_trains_close_to_fp32_and_really_runs_in_bf16[mxnet]")),
    Mutant("mxnet-bf16-ignored", "precision bf16 runs MXNet's bf16 operators (AMP)",
           (("adapters/mxnet/precision.py", "        if name == \"bf16\":\n            _amp_bf16()",
             "        pass"),),
           ("tests/test_precision.py::test_bf16_trains_close_to_fp32_and_really_runs_in_bf16[mxnet]",
            "tests/test_precision.py::test_mxnet_bf16_turns_on_mxnets_amp_in_bfloat16")),
    Mutant("tf-fp16-no-skip", "fp16 (Keras 3): a step whose reduced gradient overflows is skipped, not applied",
           (("adapters/tensorflow/precision.py", "            tf.cond(finite, update, lambda: tf.constant(False))",
             "            update()"),),
           ("tests/test_precision.py::test_fp16_trains_with_loss_scaling_and_a_blow_up_is_a_skipped_step_not_an_error[tensorflow]",)),
    Mutant("heldout-leak", "an image folder of class folders holds a fixed 20% out for evaluation, never trained on",
           (("toolkit/run/ondisk.py", "tuple(sorted(order[cut:].tolist()))", "tuple(sorted(order.tolist()))"),),
           (f"{W}::test_image_folder_checks",)),
    Mutant("images-unchecked", "a file that is not an image is one line naming it, before training",
           (("toolkit/run/ondisk.py", "        if not any(head.startswith(m) for m in MAGIC):", "        if False:"),),
           (f"{W}::test_an_unreadable_image_is_one_line_before_training",)),
    Mutant("keras-split-ignored", "every framework's reader evaluates the same held-out images",
           (("adapters/tensorflow/images.py", "            dataset(folder.eval_files, folder.eval_labels, False))",
             "            dataset(folder.train_files[:len(folder.eval_files)], folder.train_labels[:len(folder.eval_files)], "
             "False))"),),
           (f"{W}::test_each_frameworks_reader_holds_out_the_same_images[tensorflow]",)),
    Mutant("lm-not-causal", "the language model's attention is causal (its falling loss is not cheating)",
           (("adapters/tensorflow/models.py", "(a, a, use_causal_mask=True)", "(a, a)"),),
           (f"{W}::test_transformer_lm_is_causal[tensorflow]",)),
    # issue 20: toolchains, one build for every node, faults
    Mutant("sigterm-ignored", "SIGTERM: every rank finishes its step, rank 0 checkpoints, exit 75",
           (("toolkit/run/preemption.py", "            signal.signal(sig, _handler)", "            pass"),),
           ("tests/test_fault_tolerance.py::test_sigterm_stops_every_rank_after_its_step_rank_0_checkpoints_and_resume_is_exact",)),
    Mutant("sigterm-one-rank", "SIGTERM to one rank stops every rank at the same step",
           (("adapters/base.py", '        return self.mean(1.0 if preemption.requested() else 0.0, name="toolkit.should_stop") > 0',
             '        self.mean(1.0 if preemption.requested() else 0.0, name="toolkit.should_stop")\n'
             '        return preemption.requested()'),),
           ("tests/test_fault_tolerance.py::test_sigterm_stops_every_rank_after_its_step_rank_0_checkpoints_and_resume_is_exact[rank 1]",)),
    Mutant("checkpoint-write-raw", "a folder that cannot take a checkpoint is one line on every rank",
           (("toolkit/run/checkpoint.py", "        if cause is None:          # the folder takes files: the writer's own error, as it is\n            raise",
             "        if True:\n            raise"),),
           ("tests/test_fault_tolerance.py::test_a_full_or_read_only_disk_stops_every_rank_with_one_line_and_the_checkpoint_before_intact",
            "tests/test_checkpoint.py::test_a_folder_that_cannot_take_the_write_is_one_line_naming_it_and_the_cause")),
    Mutant("gcc13-undetected", "GCC >= 13 gets the missing includes, GCC >= 14 the flatbuffers fix",
           (("toolkit/build/workarounds.py", '    return b.toolchain.compiler_id == "gcc" and b.toolchain.compiler_version[:1] >= (major,)',
             "    return False"),),
           ("tests/test_horovod_build.py",)),
    Mutant("wheelhouse-any-key", "a wheelhouse build for other versions is refused",
           (("toolkit/build/wheelhouse.py", '    match = next((m for m in found if m.get("key") == key), None)',
             "    match = found[0]"),),
           ("tests/test_wheelhouse.py::test_a_build_for_other_versions_or_a_damaged_wheel_is_refused_in_one_line",)),
    Mutant("slurm-no-requeue", "a preempted Slurm job is requeued and resumes",
           (("toolkit/launch/recipes.py", """              f'if [ "$rc" -eq {EXIT_CODE} ]; then scontrol requeue "$SLURM_JOB_ID"; fi',\n""", ""),),
           ("tests/test_launch.py::test_emitted_slurm_script_requeues_a_preempted_job_and_the_next_run_resumes",)),
    Mutant("host-unchecked", "a host whose ssh port refuses or answers nothing is one line, within --start-timeout",
           (("toolkit/launch/hosts.py", "    remote = [host for host in dict.fromkeys(hosts) if not is_this_machine(host)]\n",
             "    remote = []\n"),),
           ("tests/test_multihost.py::test_a_host_whose_ssh_refuses_is_one_line_naming_it",
            "tests/test_multihost.py::test_a_host_that_answers_nothing_is_one_line_within_the_start_timeout")),
    Mutant("orte-banner", "mpirun's banner for an ssh login that fails is ssh's own line",
           (("toolkit/launch/output.py", "        if banner:                              # mpirun could not start its daemons over ssh",
             "        if False:"),),
           ("tests/test_launch.py::test_mpiruns_ssh_banner_is_one_line_with_sshs_reason",
            "tests/test_multihost.py::test_mpiruns_banner_for_an_ssh_login_that_fails_is_ssh_s_own_line")),
    Mutant("python-any-wheels", "on another Python a framework without wheels is left out, named by its requirement",
           (("toolkit/build/envsetup.py", "                    found[fw] = req\n", "                    pass\n"),),
           ("tests/test_environment.py::test_a_framework_without_wheels_for_the_python_at_hand_is_left_out",)),
    Mutant("python-any-venv", "setup refuses a virtualenv another Python made",
           (("toolkit/build/envsetup.py", "    elif (theirs := _python_version(python)) != py:", "    elif False:"),),
           ("tests/test_environment.py::test_a_virtualenv_of_another_python_is_refused_in_one_line",)),
    Mutant("ring-half-bytes", "ring allreduce moves 2(N-1)/N of the buffer through each link",
           (("toolkit/planner/scaling.py", "link.cost(2 * (n - 1), 2 * (n - 1) / n * size)", "link.cost(2 * (n - 1), (n - 1) / n * size)"),),
           ("tests/test_scaling.py::test_ring_allreduce_at_two_and_eight_ranks",)),
    Mutant("no-overlap", "communication hides behind the backward pass (only what is left at its end shows)",
           (("toolkit/planner/scaling.py", "        exposed = max(0.0, end - backward) + wait", "        exposed = comm + wait"),),
           ("tests/test_scaling.py::test_step_time_stragglers_and_methods",)),
    # issue 33: config sources, exact flags, recipes, lr schedules
    Mutant("error-source-unnamed", "a bad value's error names its source (flag, TOOLKIT_* variable, YAML file and key)",
           (("toolkit/config/values.py", """        return ConfigError(f"{self} ({'; '.join(named)})", *self.keys) if named else self""",
             "        return self"),),
           ("tests/test_config.py::test_a_range_error_names_the_flag_variable_or_yaml_file_and_key_it_came_from",)),
    Mutant("error-yaml-key-unnamed", "a YAML value's error names the file and its key",
           (("toolkit/config/sources.py", '        origins.update({k: f"{path}, key {written}" for k, written in spelled.items()})',
             "        origins.update({k: str(path) for k in spelled})"),),
           ("tests/test_config.py::test_a_range_error_names_the_flag_variable_or_yaml_file_and_key_it_came_from",)),
    Mutant("error-cross-keys-unnamed", "a rule about several keys names the source of each",
           (("toolkit/config/rules.py", '                              f"{c.compression.value!r}); add --compression topk or drop topk_ratio",\n'
             '                              "topk_ratio", "compression")',
             '                              f"{c.compression.value!r}); add --compression topk or drop topk_ratio")'),),
           ("tests/test_config.py::test_a_cross_key_error_names_the_source_of_each_key_set",)),
    Mutant("flags-abbreviated", "toolkit's subcommand flags are exact (--gpu is not --gpus)",
           (("toolkit/cli.py", '        kwargs["allow_abbrev"] = False', '        kwargs["allow_abbrev"] = True'),),
           ("tests/test_cli_errors.py::test_a_subcommands_bad_flag_is_its_own_usage_and_one_error_line",)),
    Mutant("subcommand-usage-lost", "a subcommand's bad flag shows that subcommand's usage",
           (("toolkit/cli.py", "        if extras:\n            self.error(", '        if extras and self.prog == "toolkit":\n            self.error('),),
           ("tests/test_cli_errors.py::test_a_subcommands_bad_flag_is_its_own_usage_and_one_error_line",)),
    Mutant("slurm-config-checkpoint", "--emit slurm requeues a job whose --config sets checkpoint_dir",
           (("toolkit/launch/recipes.py", '    folder = command_keys(command).get("checkpoint_dir")', "    folder = None"),),
           ("tests/test_launch.py::test_emit_slurm_reads_checkpoint_dir_from_the_config_the_command_names",)),
    Mutant("cosine-flat", "lr_schedule: cosine decays to 0 over the run after warm-up",
           (("toolkit/run/schedule.py", "        return target * (1 + math.cos(math.pi * progress)) / 2", "        return target"),),
           ("tests/test_schedule_data.py::test_cosine_schedule_decays_from_the_scaled_lr_to_zero_after_the_warmup",
            "tests/test_schedule_data.py::test_two_ranks_log_the_cosine_schedules_lr_each_epoch")),
    Mutant("cosine-ignores-warmup", "cosine's decay starts after the warm-up",
           (("toolkit/run/schedule.py", "        left = config.epochs * steps_per_epoch - warmup_steps",
             "        left = config.epochs * steps_per_epoch"),),
           ("tests/test_schedule_data.py::test_cosine_schedule_decays_from_the_scaled_lr_to_zero_after_the_warmup",)),
    Mutant("step-off-by-one", "lr_schedule: step decays every lr_step_epochs, counted from the first step",
           (("toolkit/run/schedule.py", "    return target * config.lr_step_gamma ** (step // every)",
             "    return target * config.lr_step_gamma ** ((step + 1) // every)"),),
           ("tests/test_schedule_data.py::test_step_schedule_multiplies_by_gamma_every_lr_step_epochs",)),
    # issue 33: a user's own torch code (tests/user_torch.py)
    Mutant("gan-names-collide", "two models train in one session (a GAN): their allreduces are told apart",
           (("adapters/torch/strategies/horovod.py", '        prefix = f"model{session.part_index}." if session.part_index else ""', '        prefix = ""'),),
           ("tests/test_usercode.py::test_a_gan_trains_two_models_with_their_own_optimizers_and_resumes_exactly",)),
    Mutant("gan-stray-gradients", "a backward pass for one model leaves no pending reduction in another",
           (("adapters/torch/strategies/horovod.py", "        if not self.exchange and session.optimizer._handles:\n"
             "            session.optimizer.synchronize()\n        session.optimizer.zero_grad()", "        pass"),),
           ("tests/test_usercode.py::test_a_gan_trains_two_models_with_their_own_optimizers_and_resumes_exactly",)),
    Mutant("gan-second-model-unsaved", "a checkpoint holds every model and optimizer of the session",
           (("adapters/torch/session.py", '        if others:\n            state["parts"]', '        if False:\n            state["parts"]'),),
           ("tests/test_usercode.py::test_a_gan_trains_two_models_with_their_own_optimizers_and_resumes_exactly",)),
    Mutant("dict-batches-unpacked", "a torch loader yields the DataLoader's batch as it is (dicts, any arity)",
           (("adapters/torch/session.py", "            yield map_structure(self._to_device, batch)",
             "            x, y = batch\n            yield self._to_device(x), self._to_device(y)"),),
           ("tests/test_usercode.py::test_dict_batches_through_a_collate_fn_train_a_transformers_model_with_its_own_loss",)),
    Mutant("metric-count-wrong", "evaluate(metric=...) weighs each batch by its samples",
           (("adapters/base.py", "        n = leading_size(batch)\n", "        n = 1\n"),),
           ("tests/test_usercode.py::test_dict_batches_through_a_collate_fn_train_a_transformers_model_with_its_own_loss",)),
    # issue 33: Keras/TensorFlow users' own code (tests/test_tf_usercode.py)
    Mutant("fit-statistics-apart", "after Keras fit every rank holds the same BatchNormalization statistics",
           (("adapters/tensorflow/strategies/horovod.py",
             "return [fit.BroadcastCallback(), fit.MetricAverageCallback(), fit.StatisticsCallback(self)]",
             "return [fit.BroadcastCallback(), fit.MetricAverageCallback()]"),),
           (f"{TU}::test_fit_ends_with_equal_batchnorm_statistics_and_follows_a_users_schedule[keras3]",)),
    Mutant("fit-optimizer-copied", "fit_optimizer keeps the user's optimizer (its schedule, slots and step)",
           (("adapters/tensorflow/fit.py", "    optimizer.__class__ = _Distributed\n    return optimizer",
             "    return _Distributed.from_config(optimizer.get_config())"),),
           (f"{TU}::test_fit_ends_with_equal_batchnorm_statistics_and_follows_a_users_schedule[keras3]",)),
    Mutant("tf-keras-wrapped-twice", "tf-keras fit_optimizer takes the optimizer setup returned",
           (("adapters/tensorflow/strategies/tf_keras.py", 'if hasattr(optimizer, "_allreduce_grads"):', "if False:"),),
           (f"{TU}::test_fit_ends_with_equal_batchnorm_statistics_and_follows_a_users_schedule[tf_keras]",)),
    Mutant("tf-keras-schedule-lost", "a tf-keras optimizer's schedule survives setup",
           (("adapters/tensorflow/strategies/tf_keras.py", "schedule = lr_schedule(optimizer, tf_keras)", "schedule = None"),),
           (f"{TU}::test_fit_ends_with_equal_batchnorm_statistics_and_follows_a_users_schedule[tf_keras]",)),
    Mutant("tf-dict-unpacked", "tf.data dict elements reach the user's loop as dicts",
           (("adapters/tensorflow/data.py", "    yield from ds.skip(done).take(len(plan)).prefetch(tf.data.AUTOTUNE)",
             "    for x, y in ds.skip(done).take(len(plan)).prefetch(tf.data.AUTOTUNE):\n        yield x, y"),),
           (f"{TU}::test_a_users_loop_over_dict_or_triple_elements_with_a_cosine_schedule[keras3-dict]",)),
    Mutant("tf-replicas-two-fields", "two replicas in one process join their shards field by field",
           (("adapters/tensorflow/data.py",
             "lambda *parts: tf.nest.map_structure(lambda *leaves: tf.concat(leaves, 0), *parts))",
             "lambda *parts: tuple(tf.concat([p[i] for p in parts], 0) for i in range(2)))"),),
           (f"{TU}::test_two_replicas_in_one_process_get_their_shards_joined_in_the_elements_structure",)),
    Mutant("set-lr-over-schedule", "set_lr on a scheduled Keras optimizer is one line, not Keras's TypeError",
           (("adapters/tensorflow/keras.py", "        self._refuse_schedule()\n        self.optimizer.learning_rate = lr",
             "        self.optimizer.learning_rate = lr"),),
           (f"{TU}::test_a_users_loop_over_dict_or_triple_elements_with_a_cosine_schedule[keras3-dict]",)),
    Mutant("tf-keras-loop-unreduced", "a tf-keras user's loop reduces its gradients (2 ranks == 1 rank, whole batch)",
           (("adapters/tensorflow/tf_keras.py", "self.optimizer.minimize(total, self.model.trainable_variables, tape=tape)",
             "self.optimizer.apply_gradients(zip(tape.gradient(loss, self.model.trainable_variables), "
             "self.model.trainable_variables))"),),
           (f"{TU}::test_a_tf_keras_users_loop_on_two_ranks_equals_one_rank_with_their_whole_batch",)),
    Mutant("tf-keras-dtype", "tf-keras statistics are found (its variables' dtype is a tf.DType)",
           (("adapters/tensorflow/keras.py", "if tf.as_dtype(v.dtype).is_floating]", 'if v.dtype.startswith("float")]'),),
           (f"{TU}::test_fit_ends_with_equal_batchnorm_statistics_and_follows_a_users_schedule[tf_keras]",)),
    # issue 33: MXNet Gluon users' own code (tests/test_mxnet_usercode.py)
    Mutant("mxnet-deferred-no-broadcast", "a deferred Gluon model holds rank 0's weights on every rank after its first pass",
           (("adapters/mxnet/deferred.py", "            self._shapes_known()\n            self.broadcast()",
             "            self._shapes_known()"),),
           (f"{MU}::test_a_deferred_model_trains_as_with_explicit_shapes[plain]",)),
    Mutant("mxnet-optimizer-detached", "the user's MXNet optimizer and scheduler stay the ones that train on every rank",
           (("adapters/mxnet/session.py", "        if loaded is mine:\n            return", "        if True:\n            return"),),
           (f"{MU}::test_mxnets_factor_scheduler_on_the_optimizer_given_to_setup",)),
    Mutant("mxnet-resume-no-shapes", "a deferred model resumed before its first pass takes rank 0's shapes",
           (("adapters/mxnet/strategies/horovod.py", "session.parameter_shapes() if session.rank == root else None", "None"),),
           (f"{MU}::test_a_deferred_model_resumed_before_its_first_forward_pass_ends_where_the_whole_run_did",)),
    Mutant("mxnet-batches-unpacked", "Gluon batches of any number of fields reach the user's loop whole",
           (("adapters/mxnet/session.py", "            yield map_structure(self._to_device, batch)",
             "            yield tuple(map_structure(self._to_device, batch))[:2]"),),
           (f"{MU}::test_three_field_and_dict_samples",)),
    Mutant("mxnet-dict-samples", "Gluon dict samples are batched key by key",
           (("adapters/mxnet/session.py", "        if isinstance(samples[0], dict):", "        if False:"),),
           (f"{MU}::test_three_field_and_dict_samples",)),
    Mutant("mxnet-deferred-unsized", "a deferred model's exchange is sized by its gradients once the shapes are known",
           (("adapters/mxnet/deferred.py", "        self.communication = self.strategy.communication(self)", "        pass"),),
           (f"{MU}::test_the_built_in_script_trains_a_deferred_user_module_as_the_explicit_one",)),
    Mutant("mxnet-deferred-save", "save() before a deferred model's first pass is one line",
           (("adapters/mxnet/session.py", '        if not self.shapes_known:\n            raise self._unknown_shapes("session.save()")',
             "        pass"),),
           (f"{MU}::test_what_needs_the_shapes_before_the_first_forward_pass_is_one_line",)),
    Mutant("mxnet-shapes-inside-step", "train_step takes a deferred model's shapes before the step's communication",
           (("adapters/mxnet/deferred.py", "        if not self.shapes_known:\n            self._finish_setup(self.model, (batches[0][0],))",
             "        pass"),),
           (f"{MU}::test_the_built_in_script_trains_a_deferred_user_module_as_the_explicit_one",)),
    Mutant("mxnet-block-onednn-layout", "a plain deferred Block's parameters are broadcastable after its inference pass",
           (("adapters/mxnet/deferred.py",
             "                    p._init_impl(mx.nd.array(p.data(self.ctx).asnumpy(), dtype=p.dtype), p.list_ctx())",
             "                    pass"),),
           (f"{MU}::test_a_deferred_model_trains_as_with_explicit_shapes[block-accumulation]",)),
    # issue 33: Horovod's own TensorFlow API on Keras 3, a quiet horovodrun (toolkit/build/horovod_patches.py)
    Mutant('keras3-ref', "Horovod's tape keys Keras 3 variables (no 'ref' error)",
           (('toolkit/build/horovod_patches.py', '    return _tf_variable(x).ref()\n',
             '    return x.ref()\n'),),
           ('tests/test_horovod_keras3.py::test_horovods_own_tf2_examples_run_on_keras3_with_identical_replicas[tensorflow2_synthetic_benchmark.py]',)),
    Mutant('keras3-broadcast-variables', 'hvd.broadcast_variables assigns Keras 3 variables',
           (('toolkit/build/horovod_patches.py', '"    variables = [_tf_variable(v) for v in variables]  # toolkit: keras3-api\\n"',
             '"    variables = list(variables)  # toolkit: keras3-api\\n"'),),
           ('tests/test_horovod_keras3.py::test_horovods_own_tf2_examples_run_on_keras3_with_identical_replicas[tensorflow2_synthetic_benchmark_elastic.py]',)),
    Mutant('keras3-optimizer-unreduced', 'hvd.DistributedOptimizer on a Keras 3 optimizer allreduces',
           (('toolkit/build/horovod_patches.py', '            return super(self.__class__, self).apply(self._allreduce(list(grads), trainable_variables),',
             '            return super(self.__class__, self).apply(list(grads),'),),
           ('tests/test_horovod_keras3.py::test_horovods_own_tf2_examples_run_on_keras3_with_identical_replicas[tensorflow2_keras_synthetic_benchmark.py]',)),
    Mutant('keras3-groups-by-name', "Horovod's groups tell Keras 3 variables apart (not by name)",
           (('toolkit/build/horovod_patches.py', 'Edit("horovod/tensorflow/__init__.py", "var_name2grad[var.name]", "var_name2grad[_ref(var)]", 3),',
             'Edit("horovod/tensorflow/__init__.py", "var_name2grad[var.name]", "var_name2grad[var.name]", 3),'),),
           ('tests/test_horovod_keras3.py::test_horovods_tensorflow_api_on_keras3_variables_and_optimizers',)),
    Mutant('keras3-syncbn-moments', 'hvd.SyncBatchNormalization reduces its moments under Keras 3',
           (('toolkit/build/horovod_patches.py', '         "  def _moments(self, inputs, *args, **kwargs):"),',
             '         "  def _moments_unused(self, inputs, *args, **kwargs):"),'),),
           ('tests/test_horovod_keras3.py::test_horovods_tensorflow_api_on_keras3_variables_and_optimizers',)),
    Mutant('keras3-accumulation-silent', 'backward_passes_per_step > 1 on a Keras 3 optimizer is one line',
           (('toolkit/build/horovod_patches.py', '    if backward_passes_per_step > 1 and _is_keras3_optimizer(optimizer):',
             '    if False:'),),
           ('tests/test_horovod_keras3.py::test_horovods_tensorflow_api_on_keras3_variables_and_optimizers',)),
    Mutant('keras3-metric-average', "Horovod's MetricAverageCallback averages under Keras 3",
           (('toolkit/build/horovod_patches.py', '         "hvd.allreduce(tf.constant(value, name=metric))"),',
             '         "hvd.allreduce(self.backend.constant(value, name=metric))"),'),),
           ('tests/test_horovod_keras3.py::test_horovods_tensorflow_api_on_keras3_variables_and_optimizers',)),
    Mutant('launcher-probes-tensorflow', 'horovodrun imports no framework in the launcher',
           (('toolkit/build/horovod_patches.py', '            value = json.load(f).get(key)',
             '            value = None'),),
           ('tests/test_horovod_keras3.py::test_horovodrun_imports_no_framework_and_prints_no_tensorflow_lines',)),
    Mutant('launcher-probe-chatter', 'the extension probes that remain are muted at the file descriptors',
           (('toolkit/build/horovod_patches.py', '"            os.dup2(devnull, 1)\\n            os.dup2(devnull, 2)\\n\\n"),',
             '"\\n"),'),),
           ('tests/test_horovod_keras3.py::test_the_extension_probes_that_remain_are_muted_where_cpp_writes',)),
    Mutant('patch-key-names-only', 'a changed patch gives a new cache key (no stale Horovod wheel reused)',
           (('toolkit/build/horovod.py', '    digest = hashlib.sha256(repr([(w.name, w.edits) for w in rows]).encode()).hexdigest()[:8]',
             '    digest = hashlib.sha256(repr([w.name for w in rows]).encode()).hexdigest()[:8]'),),
           ('tests/test_horovod_build.py::test_a_changed_patch_gives_a_new_cache_key',)),
    Mutant('patch-count-unchecked', "each source patch finds exactly the text it expects in Horovod's files",
           (('toolkit/build/horovod_patches.py', '        found = len(re.findall(e.old, text)) if e.regex else text.count(e.old)',
             '        found = e.count'),),
           ('tests/test_horovod_build.py::test_the_source_patches_match_horovods_own_files',)),
    Mutant('installed-unpatched', "the installed Horovod carries today's patches",
           (('toolkit/build/workarounds.py', '               in_key=True, edits=patches.KERAS3_EDITS),',
             '               edits=patches.KERAS3_EDITS),'),),
           ('tests/test_horovod_build.py::test_the_installed_horovod_carries_todays_patches',)),
    # Installing into a user's environment (issue 34): tests/test_install.py
    Mutant('dist-named-toolkit', "the distribution is not the index's unrelated `toolkit`",
           (('pyproject.toml', 'name = "horovod-toolkit"', 'name = "toolkit"'),),
           (f"{I}::test_the_distribution_is_named_apart_and_its_requirements_are_horovods_and_admit_the_pins",)),
    Mutant('runtime-requirement-dropped', "the package declares Horovod's run-time requirements",
           (('pyproject.toml', '"psutil>=5.9", ', ''),),
           (f"{I}::test_the_distribution_is_named_apart_and_its_requirements_are_horovods_and_admit_the_pins",)),
    Mutant('build-every-framework', 'build-horovod builds for the frameworks installed, not all three',
           (('toolkit/commands/build_horovod.py', '        frameworks = tuple(found)', '        frameworks = ("torch", "tensorflow", "mxnet")'),),
           (f"{I}::test_a_fresh_virtualenv_with_the_cpu_torch_2_13_wheel_installs_builds_horovod_and_trains",)),
    Mutant('runtime-not-installed', "build-horovod installs what Horovod imports at run time when it is missing",
           (('toolkit/build/horovod.py', '    absent = support.missing(support.HOROVOD_RUNTIME + support.HOROVOD_BUILD)', '    absent = []'),),
           (f"{I}::test_a_fresh_virtualenv_with_the_cpu_torch_2_13_wheel_installs_builds_horovod_and_trains",)),
    Mutant('doctor-checks-all', 'doctor --framework F checks F only',
           (('toolkit/build/doctor.py', '    wanted = list(pins.HOROVOD_FRAMEWORKS) if framework == ALL else [framework]',
             '    wanted = list(pins.HOROVOD_FRAMEWORKS)'),),
           (f"{I}::test_uv_installs_the_wheel_and_its_commands_run",)),
    Mutant('make-setup-everywhere', '`make setup` is a fix only in a checkout',
           (('toolkit/build/support.py', '    return f"`{command}`" + (" (or `make setup`)" if in_checkout() else "")',
             '    return f"`{command}` (or `make setup`)"'),),
           (f"{I}::test_fixes_name_make_setup_only_in_a_checkout", f"{I}::test_uv_installs_the_wheel_and_its_commands_run")),
    Mutant('outside-table-silent', 'a version outside the support table is said in one line',
           (('toolkit/build/support.py', '    if base in tested(framework):', '    if True:'),),
           (f"{I}::test_a_version_outside_the_table_is_one_line_and_the_local_label_is_ignored",)),
    # torch's own engine (issue 35)
    Mutant("native-accumulation-wrong-micro", "accumulation on DDP equals one large batch (the last micro-batch reduces)",
           (("adapters/torch/session.py", "self.strategy.sync_gradients(self, self.micro % k == k - 1)",
             "self.strategy.sync_gradients(self, self.micro % k == 0)"),),
           (f"{A}::test_accumulation_equals_one_large_batch[torch-native]",)),
    Mutant("native-checkpoint-wrapped", "a checkpoint written under one backend resumes under the other",
           (("adapters/torch/strategies/native.py", "return model.module if isinstance(model, DDP) else model",
             "return model"),),
           (f"{NT}::test_native_equals_horovod_and_checkpoints_cross_backends_and_sharding",)),
    Mutant("fsdp-optimizer-by-name", "an fsdp checkpoint loads unsharded (torch's own optimizer format)",
           (("adapters/torch/sharding.py", '"optimizer": _keyed(optimizer, _names(part), by_name=False) if optimizer '
             'else None}', '"optimizer": optimizer or None}'),),
           (f"{NT}::test_native_equals_horovod_and_checkpoints_cross_backends_and_sharding",)),
    Mutant("native-no-join", "uneven data on native joins as Horovod does (DDP's Join)",
           (("adapters/torch/strategies/native.py", "self.join_context = Join([session.model])",
             "self.join_context = Join([session.model], enable=False)"),),
           (f"{NT}::test_uneven_data_joins_as_horovod_does_and_bf16_and_powersgd_are_ddps_hooks",)),
    Mutant("native-bf16-bytes", "bytes_sent_per_step counts DDP's bf16 hook at 2 bytes a value",
           (("adapters/torch/comm_hooks.py", "lambda step: dense // 2", "lambda step: dense"),),
           (f"{NT}::test_uneven_data_joins_as_horovod_does_and_bf16_and_powersgd_are_ddps_hooks",)),
    Mutant("native-mpirun-unseen", "the native backend finds its rank under mpirun",
           (("adapters/torch/rendezvous.py", '("mpirun", ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE",',
             '("mpirun", ("OMPI_RANK", "OMPI_SIZE",'),),
           (f"{NT}::test_your_torch_trains_on_the_native_backend_under_torchrun_horovodrun_and_mpirun",
            f"{NT}::test_rendezvous_reads_every_launcher")),
    Mutant("dataparallel-unexplained", "backend dataparallel is refused with the reason and names native",
           (("toolkit/config/rules.py", "    if c.backend is Backend.DATAPARALLEL:\n", "    if False:\n"),),
           (f"{NT}::test_what_the_native_backend_cannot_do_is_one_line",)),
    Mutant("zero1-unsharded", "sharding zero1 keeps 1/N of the optimizer state on each rank",
           (("adapters/torch/strategies/native.py", "session.optimizer = sharding.zero1(session.optimizer)",
             "session.optimizer = session.optimizer"),),
           (f"{NT}::test_each_rank_holds_its_share[zero1]",)),
    Mutant("fsdp-blocks-unsharded", "sharding fsdp keeps 1/N of the parameters on each rank",
           (("adapters/torch/sharding.py", "    for block in _blocks(model):\n        shard(block, mp_policy=policy)\n"
             "    shard(model, mp_policy=policy)\n", ""),),
           (f"{NT}::test_each_rank_holds_its_share[fsdp]",)),
]


def run(mutant: Mutant) -> tuple[bool, float, str]:
    """(the tests failed, seconds, last line of pytest's output) with the mutant applied."""
    originals = {}
    for file, old, new in mutant.edits:
        path = ROOT / file
        text = path.read_text()
        originals.setdefault(path, text)
        if text.count(old) != 1:
            for p, t in originals.items():
                p.write_text(t)
            raise SystemExit(f"{mutant.id}: the text to change occurs {text.count(old)} times in {file}; "
                             "update the mutant")
        path.write_text(text.replace(old, new))
    try:
        t0 = time.monotonic()
        proc = subprocess.run([sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", *mutant.tests],
                              cwd=ROOT, capture_output=True, text=True)
        seconds = time.monotonic() - t0
    finally:
        for path, text in originals.items():
            path.write_text(text)
    # what failed: the first assertion or error line pytest printed (else its last line)
    why = next((ln[1:].strip() for ln in proc.stdout.splitlines() if ln.startswith("E ")), None)
    tail = why or ([ln for ln in proc.stdout.splitlines() if ln.strip()][-1:] or [""])[0]
    return proc.returncode not in (0, 5), seconds, tail[:160].replace("|", "/")      # 5: no test collected


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("ids", nargs="*", help="run only mutants whose id starts with one of these")
    p.add_argument("--list", action="store_true", help="list the mutants and exit")
    args = p.parse_args()
    chosen = [m for m in MUTANTS if not args.ids or m.id.startswith(tuple(args.ids))]
    if args.list:
        for m in chosen:
            for file, old, _ in m.edits:
                found = (ROOT / file).read_text().count(old)
                if found != 1:
                    print(f"{m.id}: the text to change occurs {found} times in {file}", file=sys.stderr)
            print(f"{m.id:24} {', '.join(sorted({f for f, _, _ in m.edits})):34} {m.claim}")
        return 0
    survived = []
    print("| mutant | claim broken | tests | caught | seconds | how the test failed |\n|---|---|---|---|---|---|")
    for m in chosen:
        caught, seconds, tail = run(m)
        if not caught:
            survived.append(m.id)
        tests = ", ".join(t.split("::")[-1] for t in m.tests)
        print(f"| {m.id} | {m.claim} | {tests} | {'yes' if caught else 'NO'} | {seconds:.0f} | {tail} |", flush=True)
    if survived:
        print(f"survived (their tests passed with the claim broken): {', '.join(survived)}", file=sys.stderr)
    return 1 if survived else 0


if __name__ == "__main__":
    sys.exit(main())
