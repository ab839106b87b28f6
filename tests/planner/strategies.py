"""Hypothesis strategies shared by the planner's property tests: random small profiles,
chains or graphs, whose ranges each test chooses."""

from hypothesis import strategies as st

from pipestudio.planner import Profile

SIZES = st.integers(0, 10**6)
MICROBATCH_OF_TWO = st.just(2)


@st.composite
def profiles(
    draw: st.DrawFn,
    *,
    max_layers: int,
    times: st.SearchStrategy[float],
    workspaces: st.SearchStrategy[int] = SIZES,
    microbatch_sizes: st.SearchStrategy[int] = MICROBATCH_OF_TWO,
    max_extra_edges: int = 4,
) -> Profile:
    """A profile of 1 to ``max_layers`` layers ``l0``, ``l1``, ...: a chain, or (half the
    time) a graph that adds up to ``max_extra_edges`` forward edges to the chain."""
    num_layers = draw(st.integers(1, max_layers))
    layers = [
        {
            "name": f"l{idx}",
            "fwd_ms": draw(times),
            "bwd_ms": draw(times),
            "param_bytes": draw(SIZES),
            "saved_bytes": draw(SIZES),
            "output_bytes": draw(SIZES),
            "workspace_bytes": draw(workspaces),
            "update_ms": draw(st.sampled_from([0.0, 0.5])),
        }
        for idx in range(num_layers)
    ]
    edges = None
    if num_layers > 1 and draw(st.booleans()):
        pairs = {(i, i + 1) for i in range(num_layers - 1)}
        pairs |= set(
            draw(
                st.lists(
                    st.tuples(
                        st.integers(0, num_layers - 1), st.integers(0, num_layers - 1)
                    ).filter(lambda pair: pair[0] < pair[1]),
                    max_size=max_extra_edges,
                )
            )
        )
        edges = [{"src": f"l{a}", "dst": f"l{b}"} for a, b in sorted(pairs)]
    return Profile.model_validate(
        {
            "model": "random",
            "microbatch_size": draw(microbatch_sizes),
            "layers": layers,
            "input_bytes": draw(SIZES),
            "edges": edges,
        }
    )
