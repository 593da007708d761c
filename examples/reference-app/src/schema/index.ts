export { apiTables, loadWebhookSecret, migrateApi } from './api-schema.js';
export { demoPhotos, seedApi, seededStockItems } from './seed-api.js';
