/**
 * Anything that runs a parameterised query the way `pg` does: a `Pool`, a `Client`, or the client of
 * an open transaction. The outbox never opens, closes or releases connections.
 */
export interface Queryable {
  query(text: string, values?: unknown[]): Promise<{ rows: any[]; rowCount: number | null }>;
}
