"""Tables of facts the other wings read: GPU instance types, EKS versions, list prices.

Nothing here imports another wing: facts change when AWS changes, not when the program does.
"""
