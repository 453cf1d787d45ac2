"""accrewrite.rules: the built-in rules, one per module, and the target profiles in targets/.

Every module here that defines ``Rule`` subclasses is registered (see accrewrite.registry).
Shared recognisers live in ``accrewrite.analysis``; a module holds one rule.
"""
