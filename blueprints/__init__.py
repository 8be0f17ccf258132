"""HTTP faces of the service. They parse input, call a service, and render: no rules live here."""
