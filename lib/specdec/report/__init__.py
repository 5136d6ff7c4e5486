"""Layer 4, report: what is shown, measured or predicted.

Measured results with bootstrap CIs (analysis, servestats, fidelity), predictions checked against
measurements and advice (advise), measured-or-predicted views (views), the claims verdicts (claims), the goals
benchmark (goals) and the plotting and writing of figures and tables (figures). May import: model, engines,
data, errors, paths.
"""
