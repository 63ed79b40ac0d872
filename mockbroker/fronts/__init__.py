"""The broker's protocols: sibling adapters over one core.

Each front translates its wire into the same calls on the store and the coordination
objects (mockbroker.state.BrokerState); no front's wire format enters the store or the
lock manager.
"""
