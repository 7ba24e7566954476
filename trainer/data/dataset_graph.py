"""What a tf.data.Dataset's graph says of it, read without running it: whether
its elements are batches of examples, and whether a second read gives the same
elements (or the same ones in another order).

The graph (`DatasetGraph`) holds every dataset op the dataset was built from,
and the functions of its maps, interleaves and windows, with the datasets those
functions return. Both questions are answered by walking it from the output,
op by op, through the functions: what matters is what each op does to its
input's elements, not which Python objects built it (a dataset of batched
datasets sampled by `sample_from_datasets`, or batched inside `flat_map`, is
batched, whatever attributes the Python objects keep).
"""

import dataclasses
import re
from typing import Optional

import tensorflow as tf

from trainer import internals

ORDER, ELEMENTS = "order", "elements"

# Ops that put N elements in one (kind of batch for each).
_BATCHING = {"BatchDataset": "batch", "ParallelBatchDataset": "batch",
             "MapAndBatchDataset": "batch", "PaddedBatchDataset": "padded",
             "DenseToSparseBatchDataset": "sparse",
             "SlidingWindowDataset": "sliding window"}
# Ops whose elements come from the datasets a function returns, with the
# function's attribute name.
_FROM_FUNCTION = {"FlatMapDataset": "f", "InterleaveDataset": "f",
                  "ParallelInterleaveDataset": "f",
                  "LegacyParallelInterleaveDataset": "f",
                  "GroupByWindowDataset": "reduce_func"}
# Ops whose elements are tuples of, or a choice among, their inputs' elements.
_COMBINING = ("ZipDataset", "ConcatenateDataset", "DirectedInterleaveDataset",
              "ChooseFromDatasets")
# Ops after which another order of the input gives other elements: the parts
# taken, the groups made, the pairs or running states formed.
_ORDER_SENSITIVE = ("Take", "Skip", "Shard", "Window", "Batch", "ParallelBatch",
                    "PaddedBatch", "MapAndBatch", "DenseToSparseBatch", "Zip",
                    "Scan", "GroupByWindow", "GroupByReducer", "SlidingWindow",
                    "DirectedInterleave", "Sampling", "TakeWhile", "Rebatch")
_SHUFFLES = re.compile(r"^Shuffle(AndRepeat)?Dataset$")
_PYTHON_OPS = ("PyFunc", "EagerPyFunc", "GeneratorDataset")
# Sources whose elements are rows of data by construction (slices, records,
# numbers): any other source (a generator, from_tensors, a saved dataset) is
# opaque.
_ROW_SOURCES = ("RangeDataset", "TensorSliceDataset", "SparseTensorSliceDataset",
                "TFRecordDataset", "TextLineDataset", "FixedLengthRecordDataset",
                "CSVDataset", "RandomDataset")
_ELEMENT = "element"  # A function's argument that is an element of the op's input.
_CHECKS = ("Assert", "Print", "PrintV2")  # Stateful, but the same values.
# Stateful ops that only read a resource (a vocabulary's lookup table, a
# normalisation's variables): the same values on every read, unless the
# pipeline assigns them too (an Assign* op, which varies).
_READS = ("ReadVariableOp", "VarHandleOp", "LookupTableFind", "LookupTableSize",
          "LookupTableExport", "HashTable", "MutableHashTable",
          "MutableDenseHashTable", "AnonymousHashTable")


def _kind(op: str) -> str:
  """An op's name without its version and "Experimental" prefix."""
  return re.sub(r"V\d+$", "", op.replace("Experimental", "", 1))


@dataclasses.dataclass(frozen=True)
class Batching:
  """How a dataset's elements relate to examples.

  Attributes:
    depth: how many batch() apply to an element (0: examples), or None where
      the graph cannot tell (`why`).
    kind: the outermost batch's kind ("batch", "padded", "ragged", ...).
    why: what cannot be decided, in words (depth None).
    opaque: the elements come from a source whose batching no graph shows
      (Python's generator, a whole tensor as one element, a saved dataset):
      depth 0 there is what the graph sees, not what the source yields.
  """
  depth: Optional[int]
  kind: Optional[str] = None
  why: Optional[str] = None
  opaque: bool = False


class DatasetGraph:
  """A dataset's graph and functions, walked from its output."""

  def __init__(self, graph_def):
    self._nodes = {node.name: node for node in graph_def.node}
    self._functions = {f.signature.name: f for f in graph_def.library.function}
    self.ops = {node.op for node in graph_def.node} | {
        node.op for f in graph_def.library.function for node in f.node_def}
    [output] = [node for node in graph_def.node if node.op == "_Retval"] or [None]
    self._output = (None, output.input[0].split(":")[0]) if output else None

  @classmethod
  def of(cls, dataset: tf.data.Dataset) -> Optional["DatasetGraph"]:
    """The graph of `dataset`, or None where it cannot be read (over protobuf's
    2 GiB: a dataset of large in-memory tensors)."""
    try:
      serialized = internals.serialized_dataset_graph(dataset)
      return cls(tf.compat.v1.GraphDef.FromString(serialized.numpy()))
    except (tf.errors.OpError, ValueError, MemoryError):
      return None

  # A reference to a dataset: (scope, node name), where scope is None (the
  # graph) or (function name, ((argument, reference or None), ...)) inside a
  # function.

  def _node(self, ref):
    scope, name = ref
    if scope is None:
      return self._nodes.get(name)
    function = self._functions[scope[0]]
    return next((n for n in function.node_def if n.name == name), None)

  def _resolve(self, scope, text: str):
    """The reference an input string names in `scope` (following Identity),
    or None where it is an element or an unknown argument."""
    name = text.lstrip("^").split(":")[0]
    arguments = {} if scope is None else dict(scope[1])
    if name in arguments:
      return arguments[name]
    node = self._node((scope, name))
    while node is not None and node.op == "Identity":
      name = node.input[0].split(":")[0]
      if name in arguments:
        return arguments[name]
      node = self._node((scope, name))
    return None if node is None else (scope, name)

  def inputs(self, ref) -> list:
    """The references of the datasets an op reads."""
    node, scope = self._node(ref), ref[0]
    found = []
    for text in node.input:
      if text.startswith("^"):
        continue
      source = self._resolve(scope, text)
      if source is not None and (source[0] == _ELEMENT or self._node(
          source).op.endswith(("Dataset", "DatasetV2", "DatasetV3", "DatasetV4",
                               "Datasets"))):
        found.append(source)
    return found

  def returned(self, ref, attribute: str) -> list:
    """The datasets function `attribute` of op `ref` returns, its captured
    arguments bound to the op's inputs (and a window argument to the op's
    input dataset)."""
    node, scope = self._node(ref), ref[0]
    function = self._functions.get(node.attr[attribute].func.name)
    if function is None:
      return []
    arguments = [arg.name for arg in function.signature.input_arg]
    count = lambda attr: len(node.attr[attr].list.type) if attr in node.attr else 0
    # The op's inputs: its dataset, then each function's captured arguments in
    # the order of the op's definition (group_by_window: key_func's first).
    offset = 1 + (count("Tkey_func_other_arguments")
                  if attribute == "reduce_func" else 0)
    captured = count("Targuments") or count(f"T{attribute}_other_arguments")
    own_inputs = [text for text in node.input if not text.startswith("^")]
    # The other arguments are elements of the op's input (or a group_by_window
    # key): their batching is the input's.
    element = self.inputs(ref)[:1]
    bound = {name: (_ELEMENT, element[0]) if element else None
             for name in arguments}
    outer = [self._resolve(scope, text)
             for text in own_inputs[offset:offset + captured]]
    if captured:
      bound.update(zip(arguments[-captured:], outer))
    if _kind(node.op) == "GroupByWindowDataset" and len(arguments) > 1:
      bound[arguments[1]] = self.inputs(ref)[0]  # The window of input elements.
    inner = (function.signature.name, tuple(bound.items()))
    returns = [self._resolve(inner, text) for text in function.ret.values()]
    return [r for r in returns if r is not None and (
        r[0] == _ELEMENT or self._node(r) is not None)]

  def function_ops(self, ref) -> set:
    """The ops of every function an op calls, nested ones included."""
    node = self._node(ref)
    pending = [attr.func.name for attr in node.attr.values() if attr.func.name]
    seen, ops = set(), set()
    while pending:
      name = pending.pop()
      if name in seen or name not in self._functions:
        continue
      seen.add(name)
      for inner in self._functions[name].node_def:
        ops.add(inner.op)
        pending += [a.func.name for a in inner.attr.values() if a.func.name]
        if inner.op in self._functions:
          pending.append(inner.op)
    return ops

  # ---- Batching. ----

  def batching(self, ref=None, seen=None) -> Batching:
    ref = ref or self._output
    if ref is None:
      return Batching(None, why="its graph has no output")
    seen = set() if seen is None else seen
    if ref in seen:
      return Batching(0)
    seen = seen | {ref}
    if ref[0] == _ELEMENT:  # An element of a dataset: its batching...
      target = ref[1]
      if target[0] != _ELEMENT and _kind(self._node(target).op) == "WindowDataset":
        # ...a window's element is a dataset of the window's input elements.
        return self.batching(self.inputs(target)[0], seen)
      return self.batching(target, seen)
    kind = _kind(self._node(ref).op)
    if kind == "WindowDataset":
      return Batching(None, why="it yields datasets (window())")
    if kind in _FROM_FUNCTION:
      return _same([self.batching(r, seen)
                    for r in self.returned(ref, _FROM_FUNCTION[kind])])
    inputs = self.inputs(ref)
    if kind in ("DirectedInterleaveDataset", "ChooseFromDatasets"):
      inputs = inputs[1:]  # The first is the selector.
    if not inputs:  # A source.
      return Batching(0, opaque=kind not in _ROW_SOURCES)
    found = [self.batching(r, seen) for r in inputs]
    if kind == "ZipDataset":  # A tuple: an index beside a batch is a batch.
      decided = [r for r in found if r.depth is not None]
      below = (max(decided, key=lambda r: r.depth) if len(decided) == len(found)
               else _same(found))
    else:
      below = _same(found)
    if below.depth is None:
      return below
    if kind in ("TensorSliceDataset", "SparseTensorSliceDataset"):
      # Slices of an element: one batch level fewer.
      depth = max(below.depth - 1, 0)
      return dataclasses.replace(below, depth=depth, kind=below.kind if depth
                                 else None)
    if kind == "TensorDataset":  # An element, as one element.
      return below
    if kind in _BATCHING:
      return Batching(below.depth + 1, _BATCHING[kind])
    if kind == "UnbatchDataset":
      return Batching(max(below.depth - 1, 0), below.kind if below.depth > 1 else None)
    if "Batch" in kind and kind != "RebatchDataset":
      return Batching(None, why=f"it uses {self._node(ref).op}, whose batching "
                      "trainer does not know")
    return below

  # ---- Reading again. ----

  def _whole_batches(self, ref):
    """The plain batch() op at `ref` (through prefetches) that keeps every
    element (drop_remainder False), or None: unbatching it gives back its
    input's elements in their order."""
    while ref is not None and ref[0] != _ELEMENT:
      node = self._node(ref)
      kind = _kind(node.op)
      # unbatch() maps its input through a function of its own first.
      normalizing = kind == "MapDataset" and re.search(
          r"_map_normalize_\d+$", node.attr["f"].func.name)
      if kind in ("PrefetchDataset", "OptionsDataset", "ModelDataset") or (
          normalizing):
        inputs = self.inputs(ref)
        ref = inputs[0] if inputs else None
        continue
      if kind == "BatchDataset" and len(node.input) >= 3:
        drop = _const_bool(self._node((ref[0], node.input[2].split(":")[0])))
        return ref if drop is False else None
      return None
    return None

  def read_variation(self, ref=None, memo=None) -> Optional[str]:
    """None, ORDER or ELEMENTS for the dataset at `ref` (see `read_variation`)."""
    ref = ref or self._output
    if ref is None:
      return ELEMENTS
    memo = {} if memo is None else memo
    if ref[0] == _ELEMENT:
      return self.read_variation(ref[1], memo)
    if ref in memo:
      return memo[ref]
    memo[ref] = None  # A cycle adds nothing.
    node = self._node(ref)
    kind = _kind(node.op)
    sources = self.inputs(ref)
    if kind == "UnbatchDataset":
      batch = self._whole_batches(sources[0]) if sources else None
      if batch is not None:  # batch() then unbatch(): the same element sequence.
        memo[ref] = self.read_variation(self.inputs(batch)[0], memo)
        return memo[ref]
    if kind in _FROM_FUNCTION:
      sources = sources + self.returned(ref, _FROM_FUNCTION[kind])
    below = [self.read_variation(r, memo) for r in sources]
    unordered = "deterministic" in node.attr and (
        node.attr["deterministic"].s == b"false")  # A parallel map's, say.
    if ELEMENTS in below or _varying_work(self.function_ops(ref) | {node.op}):
      variation = ELEMENTS
    elif ORDER in below and kind.replace("Dataset", "") in _ORDER_SENSITIVE:
      variation = ELEMENTS
    elif ORDER in below or _SHUFFLES.match(kind) or unordered:
      variation = ORDER
    else:
      variation = None
    memo[ref] = variation
    return variation


def _const_bool(node) -> Optional[bool]:
  """The value of a scalar boolean Const node, or None."""
  if node is None or node.op != "Const" or "value" not in node.attr:
    return None
  values = node.attr["value"].tensor.bool_val
  return bool(values[0]) if len(values) == 1 else None


def _same(results: list) -> Batching:
  """The batching of elements that come from any of `results`' datasets."""
  undecided = next((r for r in results if r.depth is None), None)
  if undecided is not None:
    return undecided
  depths = {r.depth for r in results}
  if len(depths) > 1:
    return Batching(None, why="it mixes batches and single examples (datasets "
                    f"batched {sorted(depths)} times)")
  if not results:
    return Batching(0)
  return dataclasses.replace(results[0], opaque=any(r.opaque for r in results))


def _varying_work(ops: set) -> bool:
  """Whether ops give other values on another read: random or stateful ops (a
  random generator, a variable's assignment) or Python, besides dataset ops,
  checks, shuffles (an order) and reads of tables and variables."""
  for op in ops:
    if any(word in op for word in ("Random", *_PYTHON_OPS)):
      if not _SHUFFLES.match(_kind(op)):
        return True
      continue
    stateful = internals.op_is_stateful(op)
    if stateful and not op.startswith(("_", *_READS)) and op not in _CHECKS and (
        not op.endswith(("Dataset", "DatasetV2", "DatasetV3", "DatasetV4"))):
      return True
  return False


def read_variation(dataset: tf.data.Dataset) -> Optional[str]:
  """What reading `dataset` again may change: None (nothing), ORDER (its
  elements come in another order: shuffles, nondeterministic parallel maps or
  interleaves, with nothing after them that takes a part of the elements,
  groups or pairs them), or ELEMENTS (other elements may come: random or
  stateful work, Python, an order-sensitive op after an order that varies, or
  a graph that cannot be read, over protobuf's 2 GiB)."""
  graph = DatasetGraph.of(dataset)
  return ELEMENTS if graph is None else graph.read_variation()


def varies_between_reads(dataset: tf.data.Dataset) -> bool:
  """Whether reading `dataset` again may give other elements or another order."""
  return read_variation(dataset) is not None


def batching(dataset: tf.data.Dataset) -> Batching:
  """How `dataset`'s elements relate to examples, from its graph (a ragged
  batch shows in its element spec); depth None with `why` where it cannot be
  told, and for a graph that cannot be read."""
  graph = DatasetGraph.of(dataset)
  if graph is None:
    return Batching(None, why="its graph cannot be read (over 2 GiB)")
  found = graph.batching()
  if found.depth and any(isinstance(spec, tf.RaggedTensorSpec)
                         for spec in tf.nest.flatten(dataset.element_spec)):
    return Batching(found.depth, "ragged")
  return found
