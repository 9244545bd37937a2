"""Helpdesk: a support-ticketing app (customers, agents, tickets, comments, tags, SLAs)."""
