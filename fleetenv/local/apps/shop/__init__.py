"""Shop: an online store (products, inventory, customers, orders, coupons, refunds)."""
