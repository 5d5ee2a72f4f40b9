"""The source patches of the workaround table (toolkit/install/workarounds.py): each row that patches
Horovod 0.28.1's sdist lists its edits here, applied to the unpacked sdist before `pip wheel` builds it.

- `gcc14-flatbuffers`, `mxnet-enqueue-name`: C++ (see their rows).
- `keras3-api`: Horovod's TensorFlow API on Keras 3 (TensorFlow >= 2.16's default Keras). Keras 3's
  Variable has no `ref()` and overloads `==` (horovod#4290: `AttributeError: 'Variable' object has no
  attribute 'ref'` in `DistributedGradientTape`) and is no tf.Variable inside a tf.function; its
  optimizers take gradients in `apply()`, never in the `get_gradients` / `_compute_gradients` that
  Horovod's wrapper allreduces in; `optimizer.variables` is a list, not a method; `keras.backend` has no
  `constant`, `get_value`, `set_value`.
- `launcher-no-framework`: `horovodrun` asks which controllers (MPI, Gloo) Horovod was built with by
  importing a framework extension, TensorFlow first, in a forked process: seconds of every launch, and
  TensorFlow's C++ start-up lines on the launcher's stderr (its mute swaps `sys.stderr`; C++ writes to
  fd 2). The build records the controllers in `horovod/metadata.json`; the launcher reads them there.

Each edit names the text it expects and how many times: a sdist that differs (another Horovod, or one
patched already) is refused in one line before any file is written. Stdlib only.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from toolkit.errors import ToolkitError
from toolkit.install import pins


@dataclass(frozen=True)
class Edit:
    path: str                  # inside the unpacked sdist
    old: str                   # the text (a regular expression when `regex`)
    new: str
    count: int = 1             # how many times `old` occurs in Horovod 0.28.1's file
    regex: bool = False
    example: str = ""          # for a regex: a text it matches (the tests build stand-in sources from it)


def apply_edits(root: Path, row: str, edits: tuple[Edit, ...]) -> None:
    """All of `edits` or none: every count is checked before a file is written."""
    texts: dict[str, str] = {}
    for e in edits:
        text = texts.get(e.path)
        if text is None:
            path = root / e.path
            if not path.is_file():
                raise ToolkitError(f"build-horovod: {row}: {e.path} is missing from the sdist (Horovod "
                                   f"{pins.HOROVOD}'s has it); drop the row or update it")
            text = path.read_text()
        found = len(re.findall(e.old, text)) if e.regex else text.count(e.old)
        if found != e.count:
            raise ToolkitError(f"build-horovod: {row}: {e.path} is not the file it patches ({found} of "
                               f"{e.count} expected matches of {e.old.splitlines()[0].strip()!r}; Horovod "
                               f"{pins.HOROVOD}'s has them); drop the row or update it")
        texts[e.path] = re.sub(e.old, e.new, text) if e.regex else text.replace(e.old, e.new)
    for name, text in texts.items():
        (root / name).write_text(text)


# -- gcc14-flatbuffers, mxnet-enqueue-name ---------------------------------------------------------------
FLATBUFFERS_SPAN = "third_party/flatbuffers/include/flatbuffers/stl_emulation.h"
# flatbuffers' own fix (google/flatbuffers#7227): span::count_ not const, as its operator= assigns it.
FLATBUFFERS_EDITS = (Edit(FLATBUFFERS_SPAN, "  const size_type count_;", "  size_type count_;"),)

OPERATIONS_CC = "horovod/common/operations.cc"
# Broadcast, alltoall and join log the op's name after queueing it. `name` is a reference into the
# caller's op; MXNet's binding frees that op (DeleteMpiOpsParam) as soon as Horovod's background thread
# finishes it, which under load can come first: the log line then copies freed memory (SIGSEGV in
# EnqueueTensorBroadcast, std::__ostream_insert). Log a copy taken before the op is queued.
ENQUEUED_LOG = """  Status status = process_set.tensor_queue.AddToTensorQueue(e, message);
  if (status.ok()) {
    LOG(TRACE, horovod_global.global_controller->GetRank())
        << "Enqueued " << name;
  }"""
ENQUEUED_LOG_FIXED = ("  const std::string enqueued_name = name;   "
                      "// toolkit: `name` may be freed once the op is queued\n"
                      + ENQUEUED_LOG.replace('<< "Enqueued " << name;', '<< "Enqueued " << enqueued_name;'))
ENQUEUED_NAME_EDITS = (Edit(OPERATIONS_CC, ENQUEUED_LOG, ENQUEUED_LOG_FIXED, 3),)


# -- keras3-api ------------------------------------------------------------------------------------------
_UTIL_HELPERS = '''

def _tf_variable(x):
    """toolkit (keras3-api): Keras 3's Variable is not a tf.Variable: it has no ref() and overloads ==, so it
    cannot key a dict (horovod#4290), and as a tf.function argument it becomes a tensor without assign().
    The tf.Variable that holds its value is one; anything else is returned as it is."""
    if hasattr(x, "ref"):
        return x
    value = getattr(x, "value", None)
    return value if isinstance(value, tf.Variable) else x


def _ref(x):
    return _tf_variable(x).ref()


def _optimizer_variables(optimizer):
    """A method on TensorFlow's and tf-keras's optimizers, a list (a property) on Keras 3's."""
    variables = optimizer.variables
    return variables() if callable(variables) else variables


def _is_keras3_optimizer(optimizer):
    return hasattr(optimizer, "stateless_apply")
'''

_IMPORT = "import tensorflow as tf\n"
_IMPORT_HELPERS = ("import tensorflow as tf\nfrom horovod.tensorflow.util import _ref, _optimizer_variables, "
                   "_is_keras3_optimizer  # toolkit: keras3-api\n")
_REF_CALL = r"\b([A-Za-z_]\w*)\.ref\(\)"


def _refs(path: str, count: int, imports: bool = True) -> tuple[Edit, ...]:
    """`x.ref()` -> `_ref(x)` in `path`, and the helpers imported there."""
    return ((Edit(path, _IMPORT, _IMPORT_HELPERS),) if imports else ()) + (
        Edit(path, _REF_CALL, r"_ref(\1)", count, regex=True, example="var.ref()"),)


_KERAS_APPLY = '''
        def apply(self, grads, trainable_variables=None):
            """toolkit (keras3-api): Keras 3 optimizers take gradients here (model.fit, apply_gradients),
            never in the get_gradients / _compute_gradients that Keras 2 optimizers are allreduced in."""
            if trainable_variables is None:
                trainable_variables = self._trainable_variables
            trainable_variables = list(trainable_variables)
            return super(self.__class__, self).apply(self._allreduce(list(grads), trainable_variables),
                                                     trainable_variables)

        def apply_gradients(self, *args, **kwargs):'''

_KERAS3_REFUSE = '''                                 scale_local_gradients=True):
    if backward_passes_per_step > 1 and _is_keras3_optimizer(optimizer):
        raise ValueError('backward_passes_per_step > 1 is not supported with Keras 3 optimizers; give the Keras 3 '
                         'optimizer gradient_accumulation_steps instead (each micro-batch is allreduced), or use '
                         'the toolkit: session.fit_optimizer() (adapters/tensorflow/fit.py)')
    class _DistributedOptimizer(*optimizer.__class__.__bases__):'''

_LR_HELPERS = '''

# toolkit (keras3-api): Keras 3 optimizers have no `lr` alias and keras.backend no get_value / set_value;
# their momentum is a Python number compiled into the train step, so it cannot be corrected per batch.
def _get_lr(backend, optimizer):
    if _is_keras3_optimizer(optimizer):
        return float(optimizer.learning_rate.numpy())
    return backend.get_value(optimizer.lr)


def _set_lr(backend, optimizer, value):
    if _is_keras3_optimizer(optimizer):
        optimizer.learning_rate = value
    else:
        backend.set_value(optimizer.lr, value)


def _corrects_momentum(optimizer, momentum_correction):
    if not (hasattr(optimizer, 'momentum') and momentum_correction):
        return False
    if _is_keras3_optimizer(optimizer):
        if optimizer.momentum:
            raise ValueError('momentum_correction=True: a Keras 3 optimizer compiles its momentum into the train '
                             'step, so it cannot be corrected per batch; pass momentum_correction=False')
        return False
    return True
'''

KERAS3_EDITS: tuple[Edit, ...] = (
    Edit("horovod/tensorflow/util.py", "    return vars.ref()\n", "    return _ref(vars)\n"),
    Edit("horovod/tensorflow/util.py", "    return refs.deref()\n", "    return refs.deref()\n" + _UTIL_HELPERS),
    # the tape, the TensorFlow optimizer, the groups (by reference: Keras 3's names, `kernel`, repeat)
    Edit("horovod/tensorflow/__init__.py", "_cache, vars_to_refs, refs_to_vars\n",
         "_cache, vars_to_refs, refs_to_vars, _ref, _tf_variable  # toolkit: keras3-api\n"),
    *_refs("horovod/tensorflow/__init__.py", 11, imports=False),
    Edit("horovod/tensorflow/__init__.py", "        return _make_subgraph(allreduce_grads)\n",
         "        subgraph = _make_subgraph(allreduce_grads)\n"
         "        return lambda grads, vars=None, use_generic_names=False: subgraph(  # toolkit: keras3-api\n"
         "            grads, None if vars is None else [_tf_variable(v) for v in vars], use_generic_names)\n"),
    Edit("horovod/tensorflow/functions.py", "    if inplace:\n        vars_by_device = {}\n",
         "    variables = [_tf_variable(v) for v in variables]  # toolkit: keras3-api\n"
         "    if inplace:\n        vars_by_device = {}\n"),
    Edit("horovod/tensorflow/functions.py",
         "from horovod.tensorflow.util import _cache, _executing_eagerly, _make_subgraph\n",
         "from horovod.tensorflow.util import _cache, _executing_eagerly, _make_subgraph, _tf_variable\n"),
    Edit("horovod/tensorflow/__init__.py", "var_name2grad[var.name]", "var_name2grad[_ref(var)]", 3),
    Edit("horovod/tensorflow/__init__.py", "if var.name in var_name2grad:", "if _ref(var) in var_name2grad:"),
    *_refs("horovod/tensorflow/gradient_aggregation.py", 5),
    *_refs("horovod/tensorflow/gradient_aggregation_eager.py", 5),
    # the Keras optimizer wrapper (horovod.tensorflow.keras, horovod.keras, hvd.DistributedOptimizer)
    *_refs("horovod/_keras/__init__.py", 5),
    Edit("horovod/_keras/__init__.py", "                                 scale_local_gradients=True):\n"
         "    class _DistributedOptimizer(*optimizer.__class__.__bases__):", _KERAS3_REFUSE),
    Edit("horovod/_keras/__init__.py", "return CallableList(super(self.__class__, self).variables())",
         "return CallableList(_optimizer_variables(super(self.__class__, self)))"),
    Edit("horovod/_keras/__init__.py", "\n        def apply_gradients(self, *args, **kwargs):", _KERAS_APPLY),
    # the callbacks
    Edit("horovod/_keras/callbacks.py", _IMPORT, _IMPORT_HELPERS + _LR_HELPERS),
    Edit("horovod/_keras/callbacks.py", _REF_CALL, r"_ref(\1)", 2, regex=True, example="var.ref()"),
    Edit("horovod/_keras/callbacks.py", "self.model.optimizer.variables()",
         "_optimizer_variables(self.model.optimizer)"),
    Edit("horovod/_keras/callbacks.py", "hvd.allreduce(self.backend.constant(value, name=metric))",
         "hvd.allreduce(tf.constant(value, name=metric))"),
    Edit("horovod/_keras/callbacks.py", "self.backend.get_value(self.model.optimizer.lr)",
         "_get_lr(self.backend, self.model.optimizer)", 4),
    Edit("horovod/_keras/callbacks.py", "self.backend.set_value(self.model.optimizer.lr, new_lr)",
         "_set_lr(self.backend, self.model.optimizer, new_lr)"),
    Edit("horovod/_keras/callbacks.py", "if hasattr(self.model.optimizer, 'momentum') and self.momentum_correction:",
         "if _corrects_momentum(self.model.optimizer, self.momentum_correction):"),
    # SyncBatchNormalization: Keras 3's BatchNormalization takes no `fused`, its _moments is (inputs, mask),
    # it builds from the shape of call's `inputs` and passes `training` only to a call that names it
    Edit("horovod/tensorflow/sync_batch_norm.py",
         "    super(SyncBatchNormalization, self).__init__(fused=fused, **kwargs)\n",
         "    if int(getattr(tf.keras, '__version__', '2').split('.')[0]) < 3:  # toolkit: keras3-api\n"
         "      kwargs['fused'] = fused\n    super(SyncBatchNormalization, self).__init__(**kwargs)\n"),
    Edit("horovod/tensorflow/sync_batch_norm.py", "  def _moments(self, inputs, reduction_axes, keep_dims, **kwargs):",
         "  def _moments(self, inputs, *args, **kwargs):"),
    Edit("horovod/tensorflow/sync_batch_norm.py",
         "._moments(\n      inputs, reduction_axes, keep_dims=keep_dims, **kwargs)",
         "._moments(inputs, *args, **kwargs)"),
    Edit("horovod/tensorflow/sync_batch_norm.py", "  def call(self, *args, **kwargs):\n"
         "    outputs = super(SyncBatchNormalization, self).call(*args, **kwargs)",
         "  def call(self, inputs, training=None, **kwargs):\n"
         "    outputs = super(SyncBatchNormalization, self).call(inputs, training=training, **kwargs)"),
    # elastic state
    Edit("horovod/tensorflow/elastic.py", _IMPORT, _IMPORT_HELPERS),
    Edit("horovod/tensorflow/elastic.py", r"\b(self\.optimizer|optimizer)\.variables\(\)",
         r"_optimizer_variables(\1)", 4, regex=True, example="optimizer.variables()"),
)


# -- launcher-no-framework -------------------------------------------------------------------------------
_METADATA_END = '''add_subdirectory(horovod/mxnet)

# Correctly wrap up json format
file(APPEND "${CMAKE_LIBRARY_OUTPUT_DIRECTORY_ROOT}/metadata.json" "\\"dummy\\": \\"none\\"\\n}")'''
_METADATA_CONTROLLERS = '''add_subdirectory(horovod/mxnet)

# toolkit (launcher-no-framework): the controllers compiled in, read by horovodrun without a framework
foreach(_toolkit_controller MPI GLOO)
    string(TOLOWER "${_toolkit_controller}" _toolkit_name)
    if(HAVE_${_toolkit_controller})
        file(APPEND "${CMAKE_LIBRARY_OUTPUT_DIRECTORY_ROOT}/metadata.json" "\\"${_toolkit_name}_built\\": true,\\n")
    else()
        file(APPEND "${CMAKE_LIBRARY_OUTPUT_DIRECTORY_ROOT}/metadata.json" "\\"${_toolkit_name}_built\\": false,\\n")
    endif()
endforeach()
''' + _METADATA_END.split("\n\n", 1)[1]

_RECORDED = '''    return wrapper


def _recorded_build(key, verbose=False):
    """toolkit (launcher-no-framework): what the build recorded in metadata.json (CMake's HAVE_MPI,
    HAVE_GLOO), so horovodrun need not import a framework extension (TensorFlow first) to ask; None
    for a build that did not record it: then the extensions are asked, as before."""
    path = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), 'metadata.json')
    try:
        with open(path) as f:
            value = json.load(f).get(key)
    except (OSError, ValueError):
        return None
    if value is not None and verbose:
        print('Horovod was {}built with {} (recorded in {}).'.format('' if value else 'NOT ', key.split('_')[0].upper(),
                                                                    path))
    return value


@_cache
def gpu_available('''


def _asks_record(controller: str) -> Edit:
    head = f"@_cache\ndef {controller}_built(verbose=False):\n"
    return Edit("horovod/common/util.py", head + "    for ext_base_name", head + "    recorded = _recorded_build("
                f"'{controller}_built', verbose)\n    if recorded is not None:\n        return recorded\n"
                "    for ext_base_name")


LAUNCHER_EDITS: tuple[Edit, ...] = (
    Edit("CMakeLists.txt", _METADATA_END, _METADATA_CONTROLLERS),
    Edit("horovod/common/util.py", "    return wrapper\n\n\n@_cache\ndef gpu_available(", _RECORDED),
    _asks_record("mpi"),
    _asks_record("gloo"),
    # the extensions that are still asked (`horovodrun --check-build`) are muted where C++ writes too
    Edit("horovod/common/util.py", "            sys.stderr = open(os.devnull, 'w')\n\n",
         "            sys.stderr = open(os.devnull, 'w')\n"
         "            devnull = os.open(os.devnull, os.O_WRONLY)  # toolkit: C++ writes to fd 1 and 2\n"
         "            os.dup2(devnull, 1)\n            os.dup2(devnull, 2)\n\n"),
)
