"""Figure builders: pure functions from planner documents and run metrics to Plotly figures.

They touch no network and no Dash state, so the pages call them from callbacks and tests
call them directly. Each chart is built from few traces (one per kind of thing drawn, with
arrays of bars or points), so a 1,000-layer profile on 16 stages draws in well under a
second.
"""
