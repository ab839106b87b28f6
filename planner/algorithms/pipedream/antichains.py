"""The antichain DAG of a layer graph: the states of PipeDream's dynamic program.

PipeDream (SOSP'19 §3.1) plans non-sequential models over *antichains*: sets of layers none
of which feeds another. Cutting the graph after an antichain's down-set (the antichain and all
its ancestors) leaves a valid stage boundary. Its optimizer (msr-fiddle/pipedream @ 11c40c0,
``graph/graph.py``: ``augment_antichain``, ``next_antichains``, ``antichain_dag``,
``topological_sort``) enumerates them as follows, and so does this module:

- start from the antichain holding the graph's first source;
- *augment* an antichain A with every ancestor p of some a in A that still feeds a layer
  outside a's cone (p -> o with o not an ancestor of a and o != a), e.g. the input of a
  residual block's shortcut;
- a *move* replaces one member x of the augmented list by a successor y of x (y not in A, no
  descendant of y in the augmented list) and keeps the maximal elements;
- breadth-first discovery, then a depth-first reverse post-order from the first antichain.

The state order matters for exactness: PipeDream's DP at inner levels relies on it (see
``dp.py``), and we reproduce it: the iteration orders that PipeDream takes from
lists are kept, and the order of its one Python ``set`` (the augmenting ancestors) is taken as
ascending layer index (in every profile we tried the resulting order does not depend on it).

Layer sets are Python ints used as bitsets (bit v = layer v of the graph given here).
"""

from collections import deque
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass

from pipestudio.planner.errors import PlannerError

#: More states than this beyond one per layer and the dynamic program is hopeless in pure
#: Python; PipeDream's own optimizer ran out of memory on the raw Inception-v3 graph for the
#: same reason. (A chain has one state per layer, however long.)
MAX_STATES = 5000


def bits(mask: int) -> Iterator[int]:
    """Indices of the set bits of ``mask``, ascending."""
    while mask:
        low = mask & -mask
        yield low.bit_length() - 1
        mask ^= low


@dataclass(frozen=True)
class AntichainDag:
    """States in PipeDream's topological order, with what its DP needs of each.

    ``augmented[s]`` is the augmented antichain (its outputs are the activations crossing a
    cut after state s); ``down_sets[s]`` the layers in or before it (bitset over layers);
    ``ancestors[s]`` the states with a path to s in the antichain DAG (bitset over states,
    without s itself).
    """

    augmented: tuple[tuple[int, ...], ...]
    down_sets: tuple[int, ...]
    ancestors: tuple[int, ...]
    successors: tuple[tuple[int, ...], ...]

    @property
    def num_states(self) -> int:
        return len(self.down_sets)

    def longest_chain(self) -> int:
        """Most states on one path: the most stages any plan can have."""
        length = [1] * self.num_states
        for state in reversed(range(self.num_states)):
            for succ in self.successors[state]:
                length[state] = max(length[state], length[succ] + 1)
        return length[0] if length else 0


class _Enumerator:
    """PipeDream's antichain enumeration on a graph given by successor lists."""

    def __init__(self, succs: Sequence[Sequence[int]], preds: Sequence[Sequence[int]]) -> None:
        self.succs = succs
        self.anc = closure(preds, order=range(len(preds)))
        self.desc = closure(succs, order=reversed(range(len(succs))))
        self.succ_mask = [sum(1 << o for o in set(out)) for out in succs]
        # An ancestor p of a feeds the next layer on its path to a, which is in a's cone or is
        # a; so only a layer feeding two or more layers can also feed one outside. Augmenting
        # scans just those (a chain has none).
        self.branching = sum(1 << v for v, out in enumerate(succs) if len(set(out)) > 1)
        self._augmented: dict[tuple[int, ...], list[int]] = {}
        self._maximal: dict[tuple[int, ...], list[int]] = {}

    def augment(self, antichain: list[int]) -> list[int]:
        key = tuple(sorted(antichain))
        cached = self._augmented.get(key)
        if cached is None:
            extra = 0
            for member in antichain:
                cone = self.anc[member]
                outside = ~(cone | (1 << member))
                for pred in bits(cone & self.branching):
                    if self.succ_mask[pred] & outside:
                        extra |= 1 << pred
            cached = self._augmented[key] = [*bits(extra), *antichain]
        return cached

    def maximal(self, members: list[int]) -> list[int]:
        """``deaugment_augmented_antichain``: members without a descendant among them."""
        key = tuple(sorted(members))
        cached = self._maximal.get(key)
        if cached is None:
            mask = sum(1 << v for v in set(members))
            cached = []
            for v in members:
                if not self.desc[v] & mask and v not in cached:
                    cached.append(v)
            self._maximal[key] = cached
        return cached

    def moves(self, antichain: list[int]) -> list[list[int]]:
        """``next_antichains``, in PipeDream's order."""
        augmented = self.augment(antichain)
        aug_mask = sum(1 << v for v in augmented)
        members = set(antichain)
        result = []
        for old in augmented:
            for new in self.succs[old]:
                if new in members or self.desc[new] & aug_mask:
                    continue
                result.append(self.maximal([new if v == old else v for v in augmented]))
        return result


def closure(neighbours: Sequence[Sequence[int]], order: Iterable[int]) -> list[int]:
    """Transitive neighbours of each node as bitsets; ``order`` visits neighbours first."""
    result = [0] * len(neighbours)
    for v in order:
        mask = 0
        for u in neighbours[v]:
            mask |= result[u] | (1 << u)
        result[v] = mask
    return result


def antichain_dag(
    succs: Sequence[Sequence[int]], preds: Sequence[Sequence[int]], *, max_states: int | None = None
) -> AntichainDag:
    """The antichain DAG of a graph whose nodes 0..n-1 are in a topological order.

    ``max_states`` defaults to MAX_STATES plus the number of layers.
    """
    if not succs:
        raise PlannerError("the layer graph is empty: nothing to plan")
    if max_states is None:
        max_states = MAX_STATES + len(succs)
    walk = _Enumerator(succs, preds)
    start = [next(v for v in range(len(preds)) if not preds[v])]
    keys: dict[tuple[int, ...], int] = {tuple(start): 0}
    lists = [start]
    edges: list[list[int]] = [[]]
    queue = deque([start])
    expanded: set[tuple[int, ...]] = set()
    while queue:
        antichain = queue.popleft()
        key = tuple(sorted(antichain))
        if key in expanded:
            continue
        expanded.add(key)
        for nxt in walk.moves(antichain):
            nxt_key = tuple(sorted(nxt))
            if nxt_key not in keys:
                if len(lists) >= max_states:
                    raise PlannerError(
                        f"the layer graph of {len(succs)} layers has more than {max_states} "
                        "antichain states; "
                        "PipeDream's optimizer needs its parallel branches compressed first "
                        "(as its compress_graph_branches script does for Inception-v3)"
                    )
                keys[nxt_key] = len(lists)
                lists.append(nxt)
                edges.append([])
            edges[keys[key]].append(keys[nxt_key])
            queue.append(nxt)
    return _in_topological_order(walk, lists, edges)


def _reverse_postorder(edges: list[list[int]]) -> list[int]:
    """``Graph.topological_sort``: depth-first from each node in discovery order."""
    done = [False] * len(edges)
    postorder: list[int] = []
    for root in range(len(edges)):
        if done[root]:
            continue
        done[root] = True
        stack = [(root, iter(edges[root]))]
        while stack:
            node, children = stack[-1]
            child = next(children, None)
            if child is None:
                postorder.append(node)
                stack.pop()
            elif not done[child]:
                done[child] = True
                stack.append((child, iter(edges[child])))
    return postorder[::-1]


def _in_topological_order(
    walk: _Enumerator, lists: list[list[int]], edges: list[list[int]]
) -> AntichainDag:
    order = _reverse_postorder(edges)
    position = {old: new for new, old in enumerate(order)}
    successors = [tuple(dict.fromkeys(position[w] for w in edges[old])) for old in order]
    ancestors = [0] * len(order)
    for state, succ_list in enumerate(successors):
        for succ in succ_list:
            ancestors[succ] |= ancestors[state] | (1 << state)
    down_sets = []
    for old in order:
        mask = 0
        for member in lists[old]:
            mask |= walk.anc[member] | (1 << member)
        down_sets.append(mask)
    return AntichainDag(
        augmented=tuple(tuple(walk.augment(lists[old])) for old in order),
        down_sets=tuple(down_sets),
        ancestors=tuple(ancestors),
        successors=tuple(successors),
    )
